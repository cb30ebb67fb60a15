// Corpus preparation (text → token shards) and the memory-mapped shard reader (see corpus.h for
// the on-disk format, docs/data.md for the full description).
#include "data/corpus.h"
#include "data/text_input.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/rng.h"

namespace data {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The shard files are raw little-endian arrays that are memory-mapped and used in place; a
// big-endian host would need a byte-swapping reader, which nothing here needs yet.
static_assert(std::endian::native == std::endian::little,
              "corpus shards are little-endian and mapped in place");

namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kFormatName = "engine-corpus";
constexpr uint32_t kSplitTag =
    0x53504c54u;  // "SPLT": keeps the split hash apart from other streams

std::string errno_text() { return std::strerror(errno); }

// ---- read faults in mapped shards ------------------------------------------------------------
// A mapped file that shrinks (truncated, rewritten in place) or whose pages cannot be read (an
// I/O error) raises SIGBUS at the next read of a lost page: there is no error code to check. The
// handler turns that into the engine's kind of message, naming the file; everything it touches is
// prepared beforehand in fixed slots (lock-free atomics, C strings), as a signal handler requires.
struct FaultSlot {
  std::atomic<bool> taken{false};
  std::atomic<uintptr_t> begin{0};  // 0: not (yet) registered
  std::atomic<size_t> bytes{0};     // the file's size
  std::atomic<size_t> span{0};      // the mapping's, whole pages
  char path[1024] = {};
};
// Four per Corpus; a mapping that finds no free slot still works, its fault just stays a signal.
constexpr size_t kFaultSlots = 64;
FaultSlot g_fault_slots[kFaultSlots];
char g_fault_hint[2][2048];
std::atomic<int> g_fault_hint_current{-1};  // which buffer holds the hint; -1: none
std::mutex g_fault_hint_mutex;              // writers of the hint
struct sigaction g_previous_sigbus;         // what a SIGBUS outside the shards goes to
std::mutex g_sigbus_mutex;                  // installing the handler

void append_text(char*& p, const char* end, const char* s) {
  while (*s && p < end) *p++ = *s++;
}

void append_number(char*& p, const char* end, uint64_t v) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = char('0' + v % 10);
    v /= 10;
  } while (v);
  while (n > 0 && p < end) *p++ = digits[--n];
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (FaultSlot& s : g_fault_slots) {
    const uintptr_t begin = s.begin.load(std::memory_order_acquire);
    if (begin == 0 || at < begin || at - begin >= s.span.load(std::memory_order_relaxed)) continue;
    char msg[4096];
    char* p = msg;
    const char* end = msg + sizeof msg - 1;
    append_text(p, end, "[corpus] ");
    append_text(p, end, s.path);
    append_text(p, end, ": reading the memory-mapped shard failed at byte ");
    append_number(p, end, at - begin);
    append_text(p, end, " of ");
    append_number(p, end, s.bytes.load(std::memory_order_relaxed));
    append_text(p, end,
                " (SIGBUS: the file was truncated or became unreadable while it was in use); "
                "the run stops here.");
    const int hint = g_fault_hint_current.load(std::memory_order_acquire);
    if (hint >= 0) {
      append_text(p, end, " ");
      append_text(p, end, g_fault_hint[hint]);
    }
    *p++ = '\n';
    for (const char* q = msg; q < p;) {
      const ssize_t w = ::write(STDERR_FILENO, q, size_t(p - q));
      if (w <= 0) break;
      q += w;
    }
    ::_exit(1);
  }
  // Not a shard: what would have happened without this handler.
  const struct sigaction& prev = g_previous_sigbus;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction)
    return prev.sa_sigaction(sig, info, context);
  if (!(prev.sa_flags & SA_SIGINFO) && prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN)
    return prev.sa_handler(sig);
  // The default action: restored, it ends the process when the faulting access repeats.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGBUS, &dfl, nullptr);
}

// Installs on_sigbus unless it is the current handler (checked at every registration: a
// program, or a test framework, may have set its own since), keeping the one it replaces.
void install_sigbus_handler() {
  std::lock_guard<std::mutex> lock(g_sigbus_mutex);
  struct sigaction current {};
  ::sigaction(SIGBUS, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
}

void register_mapping(const void* addr, size_t bytes, const std::string& path) {
  install_sigbus_handler();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (FaultSlot& s : g_fault_slots) {
    bool expected = false;
    if (!s.taken.compare_exchange_strong(expected, true)) continue;
    std::snprintf(s.path, sizeof s.path, "%s", path.c_str());
    s.bytes.store(bytes, std::memory_order_relaxed);
    s.span.store((bytes + page - 1) / page * page, std::memory_order_relaxed);
    s.begin.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_release);
    return;
  }
}

void unregister_mapping(const void* addr) {
  for (FaultSlot& s : g_fault_slots)
    if (s.begin.load(std::memory_order_acquire) == reinterpret_cast<uintptr_t>(addr)) {
      s.begin.store(0, std::memory_order_release);
      s.taken.store(false, std::memory_order_release);
      return;
    }
}

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

// A little-endian value (the host's order: see the static_assert above) into a shard file.
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

class Progress {
 public:
  Progress(bool quiet, uint64_t total_bytes)
      : quiet_(quiet),
        tty_(::isatty(::fileno(stderr)) == 1),
        total_(total_bytes),
        start_(Clock::now()),
        last_(start_) {}

  void update(uint64_t bytes, int64_t tokens) {
    if (quiet_) return;
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (since < (tty_ ? 0.25 : 10.0)) return;
    last_ = now;
    print(bytes, tokens, now);
  }
  void done(uint64_t bytes, int64_t tokens) {
    if (quiet_) return;
    print(bytes, tokens, Clock::now());
    if (tty_) std::fputc('\n', stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;

  void print(uint64_t bytes, int64_t tokens, Clock::time_point now) {
    const double secs = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const double mb = bytes / 1e6, total_mb = total_ / 1e6;
    const double frac = total_ ? std::min(1.0, static_cast<double>(bytes) / total_) : 1.0;
    char line[256];
    if (tty_) {
      char bar[31];
      const int filled = static_cast<int>(frac * 30);
      for (int i = 0; i < 30; ++i) bar[i] = i < filled ? '#' : '-';
      bar[30] = '\0';
      std::snprintf(line, sizeof(line),
                    "\r[corpus] [%s] %5.1f%%  %.1f / %.1f MB  %.1f MB/s  %lld tokens\x1b[K", bar,
                    100 * frac, mb, total_mb, mb / secs, static_cast<long long>(tokens));
    } else {
      std::snprintf(line, sizeof(line),
                    "[corpus] %.1f%%  %.1f / %.1f MB read  %.1f MB/s  %lld tokens  %.0f s\n",
                    100 * frac, mb, total_mb, mb / secs, static_cast<long long>(tokens), secs);
    }
    std::fputs(line, stderr);
    std::fflush(stderr);
  }

  bool quiet_, tty_;
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

// meta.json lookups by key path, with errors that name the file and the key.
class MetaReader {
 public:
  MetaReader(const json& root, std::string path) : root_(root), path_(std::move(path)) {}

  const json& at(const std::string& key_path) const {
    const json* node = &root_;
    size_t start = 0;
    while (start <= key_path.size()) {
      const size_t dot = key_path.find('.', start);
      const std::string key =
          key_path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      ENGINE_CHECK(node->is_object() && node->contains(key), "[corpus] ", path_, ": missing key '",
                   key_path, "' (expected a meta.json written by prepare_corpus)");
      node = &(*node)[key];
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return *node;
  }
  int64_t integer(const std::string& key, int64_t min = 0) const {
    const json& v = at(key);
    ENGINE_CHECK(v.is_number_integer() && v.get<int64_t>() >= min, "[corpus] ", path_, ": key '",
                 key, "' is ", v.dump(), " (expected an integer >= ", min, ")");
    return v.get<int64_t>();
  }
  uint64_t unsigned_integer(const std::string& key) const {
    const json& v = at(key);
    ENGINE_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
                 "[corpus] ", path_, ": key '", key, "' is ", v.dump(),
                 " (expected a non-negative integer)");
    return v.get<uint64_t>();
  }
  std::string string(const std::string& key) const {
    const json& v = at(key);
    ENGINE_CHECK(v.is_string(), "[corpus] ", path_, ": key '", key, "' is ", v.dump(),
                 " (expected a string)");
    return v.get<std::string>();
  }

 private:
  const json& root_;
  std::string path_;
};

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

int64_t sanitize_utf8(std::string_view in, std::string& out) {
  out.clear();
  out.reserve(in.size());
  int64_t replaced = 0;
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    // Copy ASCII runs in one go: most text is mostly ASCII.
    size_t j = i;
    while (j < n && static_cast<unsigned char>(in[j]) < 0x80) ++j;
    out.append(in.data() + i, j - i);
    i = j;
    if (i == n) break;
    const unsigned char c = static_cast<unsigned char>(in[i]);
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c == 0xE0) {
      need = 2, lo = 0xA0;  // no overlongs
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      need = 2;
    } else if (c == 0xED) {
      need = 2, hi = 0x9F;  // no surrogates
    } else if (c == 0xF0) {
      need = 3, lo = 0x90;  // no overlongs
    } else if (c >= 0xF1 && c <= 0xF3) {
      need = 3;
    } else if (c == 0xF4) {
      need = 3, hi = 0x8F;  // nothing above U+10FFFF
    }
    j = i + 1;
    int k = 0;
    while (k < need && j < n) {
      const unsigned char d = static_cast<unsigned char>(in[j]);
      if (k == 0 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) break;
      ++j;
      ++k;
    }
    if (need > 0 && k == need) {
      out.append(in.data() + i, j - i);
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal ill-formed subpart in[i, j)
      ++replaced;
    }
    i = j;
  }
  return replaced;
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
        {"format", kFormatName},
        {"version", kFormatVersion},
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

// ---- reading ---------------------------------------------------------------------------------

CorpusMeta read_corpus_meta(const std::string& dir) {
  const std::string path = (fs::path(dir) / "meta.json").string();
  ENGINE_CHECK(
      fs::exists(path), "[corpus] ", path,
      " not found (expected a corpus directory "
      "written by prepare_corpus; an interrupted preparation leaves only <dir>.tmp.<pid>)");
  json root;
  {
    std::ifstream f(path);
    ENGINE_CHECK(f.good(), "[corpus] cannot open ", path);
    try {
      root = json::parse(f);
    } catch (const json::exception& e) {
      ENGINE_FAIL("[corpus] ", path, " is not valid JSON: ", e.what());
    }
  }
  const MetaReader m(root, path);
  ENGINE_CHECK(m.string("format") == kFormatName, "[corpus] ", path, ": format is '",
               m.string("format"), "' (expected '", kFormatName, "')");
  ENGINE_CHECK(m.integer("version") == kFormatVersion, "[corpus] ", path, ": version ",
               m.integer("version"), " (this build reads version ", kFormatVersion, ")");
  CorpusMeta meta;
  meta.dir = dir;
  meta.token_dtype = m.string("token_dtype");
  ENGINE_CHECK(meta.token_dtype == "uint32", "[corpus] ", path, ": token_dtype '", meta.token_dtype,
               "' (expected 'uint32')");
  meta.tokenizer_kind = m.string("tokenizer.kind");
  meta.tokenizer_path = m.string("tokenizer.path");
  meta.vocab_size = m.integer("tokenizer.vocab_size", 1);
  meta.special.pad = static_cast<int32_t>(m.integer("tokenizer.special.pad", -1));
  meta.special.unk = static_cast<int32_t>(m.integer("tokenizer.special.unk", -1));
  meta.special.cls = static_cast<int32_t>(m.integer("tokenizer.special.cls", -1));
  meta.special.sep = static_cast<int32_t>(m.integer("tokenizer.special.sep", -1));
  meta.special.mask = static_cast<int32_t>(m.integer("tokenizer.special.mask", -1));
  for (Split s : {Split::train, Split::valid}) {
    const std::string key = std::string("splits.") + split_name(s) + ".";
    SplitCounts& c = s == Split::train ? meta.stats.train : meta.stats.valid;
    c.documents = m.integer(key + "documents");
    c.lines = m.integer(key + "lines");
    c.tokens = m.integer(key + "tokens");
    ENGINE_CHECK((c.documents == 0) == (c.tokens == 0), "[corpus] ", path, ": split ",
                 split_name(s), " has ", c.documents, " documents and ", c.tokens,
                 " tokens (expected both zero or both positive)");
  }
  meta.stats.lines = m.integer("lines");
  meta.stats.invalid_utf8 = m.integer("invalid_utf8_replaced");
  meta.stats.empty_documents = m.integer("empty_documents_skipped");
  meta.stats.bytes_read = m.integer("bytes_read");
  for (const json& s : m.at("sources")) {
    ENGINE_CHECK(s.is_object() && s.contains("path") && s["path"].is_string(), "[corpus] ", path,
                 ": bad entry in 'sources' (expected {\"path\": ..., \"bytes\": ...})");
    meta.sources.push_back(s["path"].get<std::string>());
  }
  meta.valid_ratio = m.integer("split_rule.valid_ratio");
  meta.seed = m.unsigned_integer("split_rule.seed");
  return meta;
}

ShardReader::Mapping ShardReader::map_file(const std::string& path, size_t expected_bytes,
                                           const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ENGINE_CHECK(fd >= 0, "[corpus] cannot open ", path, ": ", errno_text(), " (expected ", what,
               ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    ENGINE_FAIL("[corpus] cannot stat ", path, ": ", why);
  }
  if (static_cast<uint64_t>(st.st_size) != expected_bytes) {
    ::close(fd);
    ENGINE_FAIL("[corpus] ", path, " has ", st.st_size, " bytes but meta.json implies ",
                expected_bytes, " (", what,
                "): the file is truncated or belongs to another "
                "preparation");
  }
  Mapping m;
  m.bytes = expected_bytes;
  if (expected_bytes > 0) {
    void* addr = ::mmap(nullptr, expected_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      const std::string why = errno_text();
      ::close(fd);
      ENGINE_FAIL("[corpus] cannot mmap ", path, ": ", why);
    }
    m.addr = addr;
    register_mapping(addr, expected_bytes, path);
  }
  ::close(fd);  // the mapping keeps the file
  return m;
}

ShardReader::ShardReader(const CorpusMeta& meta, Split split, const OpenOptions& options)
    : split_(split) {
  const SplitCounts& c = split == Split::train ? meta.stats.train : meta.stats.valid;
  num_tokens_ = c.tokens;
  num_documents_ = c.documents;
  vocab_size_ = meta.vocab_size;
  bin_path_ = (fs::path(meta.dir) / (std::string(split_name(split)) + ".bin")).string();
  idx_path_ = (fs::path(meta.dir) / (std::string(split_name(split)) + ".idx")).string();
  try {
    // meta.json's counts are not trusted: the byte sizes they imply must not wrap around (a
    // wrapped size can match a short file and leave the checks below reading past the mapping).
    ENGINE_CHECK(num_tokens_ <= INT64_MAX / 4 && num_documents_ < INT64_MAX / 8, "[corpus] ",
                 meta.dir, "/meta.json: split ", split_name(split), " claims ", num_documents_,
                 " documents and ", num_tokens_, " tokens, more than a shard file can hold");
    const std::string tok_what = std::to_string(num_tokens_) + " tokens of u32";
    bin_ = map_file(bin_path_, static_cast<size_t>(num_tokens_) * 4, tok_what.c_str());
    const std::string idx_what = std::to_string(num_documents_ + 1) + " u64 document offsets";
    idx_ = map_file(idx_path_, static_cast<size_t>(num_documents_ + 1) * 8, idx_what.c_str());
    tokens_ = static_cast<const uint32_t*>(bin_.addr);
    offsets_ = static_cast<const uint64_t*>(idx_.addr);

    ENGINE_CHECK(offsets_[0] == 0, "[corpus] ", idx_path_, ": first offset is ", offsets_[0],
                 " (expected 0)");
    for (int64_t d = 0; d < num_documents_; ++d) {
      ENGINE_CHECK(offsets_[d + 1] > offsets_[d], "[corpus] ", idx_path_, ": offset ", d + 1,
                   " is ", offsets_[d + 1], " after ", offsets_[d],
                   " (expected strictly increasing offsets: documents are never empty)");
    }
    ENGINE_CHECK(offsets_[num_documents_] == static_cast<uint64_t>(num_tokens_), "[corpus] ",
                 idx_path_, ": last offset is ", offsets_[num_documents_], " (expected ",
                 num_tokens_, ", the token count of ", bin_path_, ")");

    if (options.check_tokens && num_tokens_ > 0) {
      ::madvise(bin_.addr, bin_.bytes, MADV_SEQUENTIAL);
      const uint32_t limit = static_cast<uint32_t>(std::min<int64_t>(vocab_size_, UINT32_MAX));
      constexpr int64_t kChunk = 1 << 16;
      for (int64_t begin = 0; begin < num_tokens_; begin += kChunk) {
        const int64_t end = std::min(num_tokens_, begin + kChunk);
        uint32_t mx = 0;
        for (int64_t i = begin; i < end; ++i) mx = std::max(mx, tokens_[i]);
        if (mx < limit || vocab_size_ > UINT32_MAX) continue;
        for (int64_t i = begin; i < end; ++i) {
          ENGINE_CHECK(tokens_[i] < limit, "[corpus] ", bin_path_, ": token ", i, " is ",
                       tokens_[i], " (expected an id below the vocabulary size ", vocab_size_,
                       " in meta.json)");
        }
      }
      ::madvise(bin_.addr, bin_.bytes, MADV_NORMAL);
    }
  } catch (...) {
    release();
    throw;
  }
}

ShardReader::ShardReader(const std::string& dir, Split split, const OpenOptions& options)
    : ShardReader(read_corpus_meta(dir), split, options) {}

void ShardReader::release() {
  for (const Mapping* m : {&bin_, &idx_})
    if (m->addr) {
      unregister_mapping(m->addr);
      ::munmap(m->addr, m->bytes);
    }
  bin_ = {};
  idx_ = {};
  tokens_ = nullptr;
  offsets_ = nullptr;
}

ShardReader::~ShardReader() { release(); }

ShardReader::ShardReader(ShardReader&& other) noexcept { *this = std::move(other); }

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  if (this != &other) {
    release();
    split_ = other.split_;
    bin_path_ = std::move(other.bin_path_);
    idx_path_ = std::move(other.idx_path_);
    bin_ = other.bin_;
    idx_ = other.idx_;
    tokens_ = other.tokens_;
    offsets_ = other.offsets_;
    num_tokens_ = other.num_tokens_;
    num_documents_ = other.num_documents_;
    vocab_size_ = other.vocab_size_;
    other.bin_ = {};
    other.idx_ = {};
    other.tokens_ = nullptr;
    other.offsets_ = nullptr;
    other.num_tokens_ = other.num_documents_ = 0;
  }
  return *this;
}

void set_read_fault_hint(const std::string& hint) {
  std::lock_guard<std::mutex> lock(g_fault_hint_mutex);
  if (hint.empty()) {
    g_fault_hint_current.store(-1, std::memory_order_release);
    return;
  }
  // Fill the buffer the handler is not reading, then point it there.
  const int next = g_fault_hint_current.load(std::memory_order_relaxed) == 0 ? 1 : 0;
  std::snprintf(g_fault_hint[next], sizeof g_fault_hint[next], "%s", hint.c_str());
  g_fault_hint_current.store(next, std::memory_order_release);
}

std::span<const uint32_t> ShardReader::document(int64_t d) const {
  ENGINE_CHECK(d >= 0 && d < num_documents_, "[corpus] document ", d, " of ", bin_path_,
               " is out of range (the split has ", num_documents_, " documents)");
  return {tokens_ + offsets_[d], static_cast<size_t>(offsets_[d + 1] - offsets_[d])};
}

Corpus::Corpus(const std::string& dir, const OpenOptions& options)
    : meta_(read_corpus_meta(dir)),
      train_(meta_, Split::train, options),
      valid_(meta_, Split::valid, options) {}

}  // namespace data
