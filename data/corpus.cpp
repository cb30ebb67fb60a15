// Corpus preparation: text -> token shards and meta.json, written atomically (see corpus.h for
// the on-disk format, docs/data.md for the full description). Reading them: shards.cpp.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "data/corpus_format.h"
#include "data/text_input.h"
#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/progress.h"
#include "engine/rng.h"

namespace data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uint32_t kSplitTag =
    0x53504c54u;  // "SPLT": keeps the split hash apart from other streams

bool is_blank(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\v' && c != '\f') return false;
  return true;
}

// ---- output: engine::FileWriter (buffered, fsynced on close) into a temporary directory --------

// Puts the directory `from` in place of the existing directory `to` and `to`'s old contents at
// `from`, durably. renameat2's RENAME_EXCHANGE swaps the two in one step; on a file system
// without it, `to` moves aside to "<to>.old.tmp.<pid>", `from` takes its name (or `to` is moved
// back), and the old one ends at `from`. An error leaves `to` as it was.
void replace_directory(const fs::path& from, const fs::path& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    ENGINE_CHECK(err == EINVAL || err == ENOSYS || err == ENOTSUP, "[corpus] ", to.string(),
                 ": cannot swap in the new corpus '", from.string(), "' (", std::strerror(err),
                 "); the previous corpus is unchanged");
    const std::string aside = engine::temporary_path(to.string() + ".old");
    ENGINE_CHECK(::rename(to.c_str(), aside.c_str()) == 0, "[corpus] ", to.string(),
                 ": cannot move the previous corpus aside to ", aside, " (", errno_text(),
                 "); it is unchanged");
    if (::rename(from.c_str(), to.c_str()) != 0) {
      const std::string why = errno_text();
      ::rename(aside.c_str(), to.c_str());
      ENGINE_FAIL("[corpus] ", to.string(), ": cannot rename '", from.string(), "' over it (", why,
                  "); the previous corpus is unchanged");
    }
    ENGINE_CHECK(::rename(aside.c_str(), from.c_str()) == 0, "[corpus] cannot rename ", aside,
                 " to ", from.string(), " (", errno_text(), "): remove it by hand");
  }
  engine::fsync_directory(to.has_parent_path() ? to.parent_path().string() : ".", "corpus");
}

// A little-endian value (the host's order: see the static_assert in corpus_format.h) into a shard
// file.
template <class T>
void put(engine::FileWriter& f, T v) {
  f.write(&v, sizeof(v));
}

// Removes the temporary directories of earlier preparations of `out` that were killed:
// "<out>.tmp.<pid>" whose process is gone (or whose pid is this process's, reused), and
// "<out>.tmp" left by builds before the pid suffix. A running preparation's directory is left
// alone.
void remove_stale_temporaries(const fs::path& out) {
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const std::string prefix = out.filename().string() + ".tmp";
  std::vector<fs::path> stale;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    if (rest.empty()) {
      stale.push_back(e.path());
    } else if (rest.size() > 1 && rest.size() <= 11 && rest[0] == '.' &&
               std::all_of(rest.begin() + 1, rest.end(),
                           [](char c) { return c >= '0' && c <= '9'; })) {
      const long long pid = std::stoll(rest.substr(1));
      if (pid == ::getpid() || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH))
        stale.push_back(e.path());
    }
  }
  for (const fs::path& p : stale) fs::remove_all(p);
}

// ---- progress: a bar on a terminal, periodic lines in a log, nothing when quiet ---------------

// On the project's progress line (engine/progress.h), its plain lines on stderr: a bar on a
// terminal every 0.25 s, a line every 10 s in a log.
class Progress {
 public:
  Progress(bool quiet, uint64_t total_bytes)
      : quiet_(quiet),
        line_(!quiet, stderr),
        total_(total_bytes),
        start_(Clock::now()),
        last_(start_) {}

  void update(uint64_t bytes, int64_t tokens) {
    if (quiet_) return;
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (since < (line_.tty() ? 0.25 : 10.0)) return;
    last_ = now;
    print(bytes, tokens, now);
  }
  void done(uint64_t bytes, int64_t tokens) {
    if (quiet_) return;
    print(bytes, tokens, Clock::now());
    line_.end_line();
  }

 private:
  using Clock = std::chrono::steady_clock;

  void print(uint64_t bytes, int64_t tokens, Clock::time_point now) {
    const double secs = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const double mb = bytes / 1e6, total_mb = total_ / 1e6;
    const double frac = total_ ? std::min(1.0, static_cast<double>(bytes) / total_) : 1.0;
    char line[256];
    if (line_.tty()) {
      std::snprintf(line, sizeof(line),
                    "[corpus] %s %5.1f%%  %.1f / %.1f MB  %.1f MB/s  %lld tokens",
                    engine::progress_bar(frac).c_str(), 100 * frac, mb, total_mb, mb / secs,
                    static_cast<long long>(tokens));
    } else {
      std::snprintf(line, sizeof(line),
                    "[corpus] %.1f%%  %.1f / %.1f MB read  %.1f MB/s  %lld tokens  %.0f s",
                    100 * frac, mb, total_mb, mb / secs, static_cast<long long>(tokens), secs);
    }
    line_.print(line);
  }

  bool quiet_;
  engine::ProgressLine line_;
  uint64_t total_;
  Clock::time_point start_, last_;
};

// ---- meta.json --------------------------------------------------------------------------------

json split_json(const SplitCounts& c, Split s) {
  return {{"documents", c.documents},
          {"lines", c.lines},
          {"tokens", c.tokens},
          {"bin", std::string(split_name(s)) + ".bin"},
          {"idx", std::string(split_name(s)) + ".idx"}};
}

}  // namespace

const char* split_name(Split s) { return s == Split::train ? "train" : "valid"; }

bool is_valid_document(uint64_t index, uint64_t seed, int64_t valid_ratio) {
  if (valid_ratio <= 0) return false;
  const uint32_t ctr[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                           kSplitTag, 0u};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint32_t out[4];
  engine::philox4x32_10(ctr, key, out);
  return out[0] % static_cast<uint64_t>(valid_ratio + 1) == 0;
}

CorpusStats prepare_corpus(const std::vector<std::string>& inputs, const Tokenizer& tok,
                           const std::string& out_dir, const PrepareOptions& options) {
  ENGINE_CHECK(!inputs.empty(),
               "[corpus] no input files given (expected text files, one "
               "sentence or paragraph per line, blank lines between documents)");
  ENGINE_CHECK(options.valid_ratio >= 0, "[corpus] valid_ratio is ", options.valid_ratio,
               " (expected >= 0: one document in valid_ratio + 1 goes to valid; 0 = none)");
  const int64_t vocab = tok.vocab_size();
  ENGINE_CHECK(vocab > 0 && vocab <= (int64_t{1} << 32), "[corpus] tokenizer ", tok.path(),
               " has vocabulary size ", vocab, " (expected 1 .. 2^32: ids are stored as u32)");

  uint64_t total_bytes = 0;
  for (const std::string& in : inputs) {
    std::error_code ec;
    ENGINE_CHECK(fs::exists(in, ec), "[corpus] input file ", in, " does not exist");
    ENGINE_CHECK(fs::is_regular_file(in, ec), "[corpus] input ", in,
                 " is not a regular file (expected a text or .xz file)");
    total_bytes += fs::file_size(in);
  }

  // "dir/" and "dir" name the same corpus; the temporary directory sits next to it.
  fs::path out = fs::path(out_dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  ENGINE_CHECK(!out.empty() && out.filename() != "." && out.filename() != "..",
               "[corpus] output directory '", out_dir, "' is not a usable directory name");
  const fs::path tmp = engine::temporary_path(out.string());  // "<out>.tmp.<pid>"
  {
    std::error_code ec;
    if (fs::exists(out, ec)) {
      ENGINE_CHECK(fs::is_directory(out), "[corpus] output ", out.string(),
                   " exists and is not a directory");
      if (!fs::is_empty(out)) {
        ENGINE_CHECK(options.overwrite, "[corpus] output directory ", out.string(),
                     " exists and is not empty (pass overwrite to replace it)");
        // Overwriting deletes the directory: only do that to something that is a corpus.
        ENGINE_CHECK(fs::exists(out / "meta.json"), "[corpus] refusing to overwrite ", out.string(),
                     ": it is not a prepared corpus (no meta.json)");
      }
    }
  }
  remove_stale_temporaries(out);
  fs::create_directories(tmp);

  CorpusStats stats;
  try {
    engine::FileWriter bin[2] = {engine::FileWriter((tmp / "train.bin").string(), "corpus"),
                                 engine::FileWriter((tmp / "valid.bin").string(), "corpus")};
    engine::FileWriter idx[2] = {engine::FileWriter((tmp / "train.idx").string(), "corpus"),
                                 engine::FileWriter((tmp / "valid.idx").string(), "corpus")};
    put<uint64_t>(idx[0], 0);
    put<uint64_t>(idx[1], 0);
    SplitCounts* counts[2] = {&stats.train, &stats.valid};

    Progress progress(options.quiet, total_bytes);
    uint64_t bytes_before = 0;  // of the files already finished
    uint64_t doc_index = 0;
    bool in_doc = false;
    int cur = 0;
    int64_t doc_tokens = 0, doc_lines = 0;
    auto end_document = [&] {
      if (!in_doc) return;
      in_doc = false;
      ++doc_index;
      if (doc_tokens == 0) {
        ++stats.empty_documents;
        return;
      }
      SplitCounts& c = *counts[cur];
      ++c.documents;
      c.lines += doc_lines;
      put<uint64_t>(idx[cur], static_cast<uint64_t>(c.tokens));
    };

    std::string raw, clean;
    for (const std::string& path : inputs) {
      TextFile file(path);
      TextLines lines(file);
      while (lines.next(raw)) {
        stats.invalid_utf8 += sanitize_utf8(raw, clean);
        if (is_blank(clean)) {
          end_document();
          continue;
        }
        if (!in_doc) {
          in_doc = true;
          cur = is_valid_document(doc_index, options.seed, options.valid_ratio) ? 1 : 0;
          doc_tokens = doc_lines = 0;
        }
        ++stats.lines;
        ++doc_lines;
        const std::vector<int32_t> ids = tok.encode(clean);
        for (int32_t id : ids) {
          ENGINE_CHECK(id >= 0 && id < vocab, "[corpus] tokenizer ", tok.path(), " returned id ",
                       id, " for a line of ", path, " (expected 0 .. ", vocab - 1, ")");
          put<uint32_t>(bin[cur], static_cast<uint32_t>(id));
        }
        doc_tokens += static_cast<int64_t>(ids.size());
        counts[cur]->tokens += static_cast<int64_t>(ids.size());
        progress.update(bytes_before + file.consumed(), stats.train.tokens + stats.valid.tokens);
      }
      end_document();  // a file's end ends its last document
      bytes_before += file.consumed();
    }
    stats.bytes_read = static_cast<int64_t>(bytes_before);
    progress.done(bytes_before, stats.train.tokens + stats.valid.tokens);

    std::string sources;
    for (const std::string& in : inputs) sources += (sources.empty() ? "" : ", ") + in;
    ENGINE_CHECK(stats.train.tokens + stats.valid.tokens > 0, "[corpus] no tokens in ", sources,
                 " (", stats.lines, " non-blank lines; expected text, one sentence or paragraph ",
                 "per line)");

    for (int s = 0; s < 2; ++s) {
      bin[s].close();
      idx[s].close();
    }

    json src = json::array();
    for (const std::string& in : inputs)
      src.push_back({{"path", fs::absolute(in).string()}, {"bytes", fs::file_size(in)}});
    const SpecialIds& sp = tok.special();
    json meta = {
        {"format", kCorpusFormatName},
        {"version", kCorpusFormatVersion},
        {"tokenizer",
         {{"kind", tok.kind()},
          {"path",
           fs::absolute(tok.path()).lexically_normal().string()},  // usable from any directory
          {"vocab_size", vocab},
          {"special",
           {{"pad", sp.pad},
            {"unk", sp.unk},
            {"cls", sp.cls},
            {"sep", sp.sep},
            {"mask", sp.mask}}}}},
        {"token_dtype", "uint32"},
        {"index_dtype", "uint64"},
        {"byte_order", "little"},
        {"splits",
         {{"train", split_json(stats.train, Split::train)},
          {"valid", split_json(stats.valid, Split::valid)}}},
        {"lines", stats.lines},
        {"invalid_utf8_replaced", stats.invalid_utf8},
        {"empty_documents_skipped", stats.empty_documents},
        {"bytes_read", stats.bytes_read},
        {"sources", src},
        {"split_rule",
         {{"valid_ratio", options.valid_ratio},
          {"seed", options.seed},
          {"rule",
           "document i (0-based over all documents of all sources in order, empty ones "
           "included) goes to valid iff word 0 of Philox4x32-10(counter = (i mod 2^32, i div "
           "2^32, 0x53504c54, 0), key = seed) mod (valid_ratio + 1) == 0; valid_ratio 0: none"}}},
    };
    engine::FileWriter meta_file((tmp / "meta.json").string(), "corpus");
    meta_file.write(meta.dump(2) + "\n");
    meta_file.close();
    engine::fsync_directory(tmp.string(), "corpus");  // the five names before the rename

    // The complete directory replaces the old one (checked above: absent, empty, or a corpus
    // with overwrite) in one rename, made durable by fsyncing the directory that holds it. An
    // existing one is swapped with it atomically, so the previous shards stay whole under
    // out_dir until the new ones are there, and are removed after (they are then at tmp).
    if (fs::exists(out))
      replace_directory(tmp, out);
    else
      engine::rename_durably(tmp.string(), out.string(), "corpus");
    std::error_code ec;
    fs::remove_all(tmp, ec);  // the previous corpus, if any
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  if (!options.quiet) {
    std::fprintf(
        stderr,
        "[corpus] wrote %s: train %lld documents / %lld tokens, valid %lld documents / "
        "%lld tokens; %lld invalid UTF-8 sequences replaced, %lld empty documents "
        "skipped\n",
        out.c_str(), static_cast<long long>(stats.train.documents),
        static_cast<long long>(stats.train.tokens), static_cast<long long>(stats.valid.documents),
        static_cast<long long>(stats.valid.tokens), static_cast<long long>(stats.invalid_utf8),
        static_cast<long long>(stats.empty_documents));
  }
  return stats;
}

}  // namespace data
