// Reading a prepared corpus: meta.json, the memory-mapped shards (ShardReader) with the SIGBUS
// guard that turns a read fault in a mapping into a clear message, and Corpus (see corpus.h for
// the on-disk format, docs/data.md for the full description).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "data/corpus.h"
#include "data/corpus_format.h"
#include "engine/error.h"

namespace data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

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
  ENGINE_CHECK(m.string("format") == kCorpusFormatName, "[corpus] ", path, ": format is '",
               m.string("format"), "' (expected '", kCorpusFormatName, "')");
  ENGINE_CHECK(m.integer("version") == kCorpusFormatVersion, "[corpus] ", path, ": version ",
               m.integer("version"), " (this build reads version ", kCorpusFormatVersion, ")");
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
