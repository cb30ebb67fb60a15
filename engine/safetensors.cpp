// safetensors reading and writing. Loading trusts nothing in the file: the header is parsed and
// checked completely (types, dtypes, sizes, exact coverage of the data buffer, the file's length)
// before any tensor is allocated, so a corrupt or truncated file is an engine::Error naming the
// path and the problem, never a crash or an allocation the file cannot back. Files written here
// carry CRC-32 checksums of the header and of every tensor in the metadata, verified on load, so
// damaged data is an error too, not only a damaged header.
#include "engine/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <zlib.h>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/file_io.h"

namespace engine {

// The file is little-endian; tensor bytes are written and read with memcpy-level copies.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A header this large is not a checkpoint of ours (the reference implementation caps it too);
// refusing it early keeps a corrupt length field from becoming a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The checksums save_safetensors writes into the metadata (docs/checkpoint.md), each 8 lowercase
// hex digits of a CRC-32 (zlib's, the IEEE polynomial): of every tensor's bytes, and of the
// header (canonical_header). Loading verifies them and returns the metadata without them.
constexpr const char* kTensorCrcPrefix = "engine.crc32.";
constexpr const char* kHeaderCrcKey = "engine.header_crc32";

// CRC-32 of n bytes. Large buffers are split over the OpenMP threads and the pieces joined with
// crc32_combine, so checksumming costs a fraction of the disk write or read it accompanies.
uint32_t crc32_of(const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  constexpr size_t kBlock = size_t(8) << 20;
  if (n < 4 * kBlock) return static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), p, n));
  const int64_t blocks = static_cast<int64_t>((n + kBlock - 1) / kBlock);
  std::vector<uLong> crcs(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = size_t(b) * kBlock, len = std::min(kBlock, n - begin);
    crcs[size_t(b)] = crc32_z(crc32_z(0, nullptr, 0), p + begin, len);
  }
  uLong crc = crcs[0];
  for (int64_t b = 1; b < blocks; ++b) {
    const size_t len = std::min(kBlock, n - size_t(b) * kBlock);
    crc = crc32_combine(crc, crcs[size_t(b)], static_cast<z_off_t>(len));
  }
  return static_cast<uint32_t>(crc);
}

std::string crc_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

bool parse_crc_hex(const std::string& s, uint32_t& out) {
  if (s.size() != 8) return false;
  uint32_t v = 0;
  for (char c : s) {
    if (c >= '0' && c <= '9')
      v = (v << 4) | uint32_t(c - '0');
    else if (c >= 'a' && c <= 'f')
      v = (v << 4) | uint32_t(c - 'a' + 10);
    else
      return false;
  }
  out = v;
  return true;
}

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  ENGINE_FAIL("[safetensors] unknown dtype code ", static_cast<int>(t));
}

bool parse_st_dtype(const std::string& s, DType& out) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::f32}, {"F64", DType::f64}, {"BF16", DType::bf16},
      {"F16", DType::f16}, {"I32", DType::i32}, {"I64", DType::i64},
      {"U8", DType::u8},   {"BOOL", DType::u8},  // one byte per element, 0 or 1: the engine has no
                                                 // bool dtype
  };
  for (const auto& [name, t] : table)
    if (s == name) {
      out = t;
      return true;
    }
  return false;
}

// One tensor as the header describes it.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  std::string dtype_text;  // as the file spells it ("BOOL" loads as u8)
  Shape shape;
  uint64_t begin = 0, end = 0;  // relative to the start of the data buffer
  bool has_crc = false;         // the metadata holds its checksum
  uint32_t crc = 0;
};

struct Header {
  std::vector<Entry> entries;    // sorted by data offset
  SafetensorsMetadata metadata;  // without the checksum keys
  uint64_t data_start = 0;       // 8 + header length
  bool checksummed = false;      // the header carried kHeaderCrcKey and matched it
};

// The text the header checksum covers: the fields this format defines (every tensor's dtype,
// shape and data_offsets, and the metadata but kHeaderCrcKey) as compact JSON with sorted keys,
// so it depends on no writer's key order, spacing or extra fields. Built from checked values:
// never deeper than three levels.
std::string canonical_header(const std::vector<Entry>& entries, const SafetensorsMetadata& meta) {
  json j = json::object();
  json m = json::object();
  for (const auto& [k, v] : meta)
    if (k != kHeaderCrcKey) m[k] = v;
  j["__metadata__"] = std::move(m);
  for (const Entry& e : entries)
    j[e.name] = {{"dtype", e.dtype_text},
                 {"shape", e.shape},
                 {"data_offsets", json::array({e.begin, e.end})}};
  return j.dump();
}

std::string os_error() { return std::strerror(errno); }

// Opens `path` for reading and returns its size.
uint64_t open_for_read(const std::string& path, std::ifstream& f) {
  errno = 0;
  f.open(path, std::ios::binary);
  ENGINE_CHECK(f.is_open(), "[safetensors] ", path, ": cannot open file (",
               errno ? os_error() : std::string("unknown error"), ")");
  std::error_code ec;
  ENGINE_CHECK(!fs::is_directory(path, ec), "[safetensors] ", path,
               ": is a directory, expected a safetensors file");
  uint64_t size = fs::file_size(path, ec);
  ENGINE_CHECK(!ec, "[safetensors] ", path, ": cannot read the file size (", ec.message(), ")");
  return size;
}

void read_at(std::ifstream& f, const std::string& path, uint64_t offset, void* dst, uint64_t n) {
  if (n == 0) return;
  f.clear();
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  ENGINE_CHECK(f && static_cast<uint64_t>(f.gcount()) == n, "[safetensors] ", path, ": reading ", n,
               " bytes at offset ", offset, " failed (got ", f.gcount(),
               "; was the file changed while it was read?)");
}

// A JSON value for an error message. Never dumps deep nesting (dump() recurses, and a hostile
// header can nest millions deep) and never prints more than a line.
std::string brief(const json& v) {
  if (v.is_structured())
    for (const json& c : v)
      if (c.is_structured()) return std::string("a nested ") + v.type_name();
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Reads a JSON array of integers that must be non-negative and fit in int64.
bool json_uint_array(const json& j, std::vector<uint64_t>& out) {
  if (!j.is_array()) return false;
  out.clear();
  for (const json& v : j) {
    if (!v.is_number_unsigned()) return false;
    out.push_back(v.get<uint64_t>());
  }
  return true;
}

Entry parse_entry(const std::string& path, const std::string& name, const json& j) {
  const std::string where = detail::concat("[safetensors] ", path, ": tensor '", name, "'");
  ENGINE_CHECK(j.is_object(), "[safetensors] ", path, ": entry '", name,
               "' is not an object (it is ", j.type_name(),
               "); expected {\"dtype\", \"shape\", \"data_offsets\"}");
  auto field = [&](const char* key) -> const json& {
    auto it = j.find(key);
    ENGINE_CHECK(it != j.end(), where, " has no \"", key, "\" field");
    return *it;
  };
  Entry e;
  e.name = name;

  const json& dt = field("dtype");
  ENGINE_CHECK(dt.is_string(), where, ": \"dtype\" is ", dt.type_name(),
               ", expected a string such as \"F32\"");
  ENGINE_CHECK(parse_st_dtype(dt.get<std::string>(), e.dtype), where, " has unknown dtype '",
               dt.get<std::string>(), "' (supported: F32, F64, BF16, F16, I32, I64, U8, BOOL)");
  e.dtype_text = dt.get<std::string>();

  const json& sh = field("shape");
  ENGINE_CHECK(sh.is_array(), where, ": \"shape\" is ", sh.type_name(),
               ", expected an array of non-negative integers");
  int64_t numel = 1;
  for (const json& d : sh) {
    ENGINE_CHECK(d.is_number_integer(), where, ": \"shape\" ", brief(sh),
                 " has a non-integer entry ", brief(d));
    ENGINE_CHECK(!d.is_number_unsigned() || d.get<uint64_t>() <= uint64_t(INT64_MAX), where,
                 ": dimension ", brief(d), " in shape ", brief(sh), " is too large");
    int64_t v = d.get<int64_t>();
    ENGINE_CHECK(v >= 0, where, " has negative dimension ", v, " in shape ", brief(sh));
    e.shape.push_back(v);
    ENGINE_CHECK(!__builtin_mul_overflow(numel, v, &numel), where, ": the element count of shape ",
                 brief(sh), " overflows 64 bits");
  }
  int64_t nbytes = 0;
  ENGINE_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(e.dtype)), &nbytes),
               where, ": the byte size of shape ", brief(sh), " of ", dt.get<std::string>(),
               " overflows 64 bits");

  const json& off = field("data_offsets");
  std::vector<uint64_t> o;
  ENGINE_CHECK(json_uint_array(off, o) && o.size() == 2, where, ": \"data_offsets\" is ",
               brief(off), ", expected [begin, end] with non-negative integers");
  e.begin = o[0];
  e.end = o[1];
  ENGINE_CHECK(e.end >= e.begin, where, " has data_offsets [", e.begin, ", ", e.end,
               "]: end is before begin");
  ENGINE_CHECK(e.end - e.begin == static_cast<uint64_t>(nbytes), where, " has data_offsets [",
               e.begin, ", ", e.end, "] spanning ", e.end - e.begin, " bytes but shape ",
               shape_str(e.shape), " of ", dt.get<std::string>(), " needs ", nbytes, " bytes");
  return e;
}

// Checks the checksum metadata of a parsed, validated header and moves the tensor checksums
// into its entries: the header's own checksum first (any changed byte of what the format
// defines), then each "engine.crc32.<name>" (8 hex digits, naming a tensor of the file). A file
// with checksums has them all: the header's and one per tensor, so a damaged key cannot turn
// verification off. A file without any (not written here: a Hugging Face file, an older
// checkpoint) loads unverified.
void read_checksums(const std::string& path, Header& h) {
  auto bad_value = [&](const std::string& key, const std::string& value, const std::string& what) {
    ENGINE_FAIL("[safetensors] ", path, ": metadata '", key, "' is ", brief(json(value)),
                ", expected 8 lowercase hex digits (", what, "): the header is damaged");
  };
  auto hk = h.metadata.find(kHeaderCrcKey);
  if (hk != h.metadata.end()) {
    uint32_t stored = 0;
    if (!parse_crc_hex(hk->second, stored))
      bad_value(hk->first, hk->second, "the CRC-32 of the header");
    const std::string text = canonical_header(h.entries, h.metadata);
    const uint32_t computed = crc32_of(text.data(), text.size());
    ENGINE_CHECK(computed == stored, "[safetensors] ", path,
                 ": the header fails its checksum (stored crc32 ", hk->second, ", computed ",
                 crc_hex(computed), "): the file is damaged");
    h.metadata.erase(hk);
    h.checksummed = true;
  }
  std::unordered_map<std::string, Entry*> by_name;
  for (Entry& e : h.entries) by_name.emplace(e.name, &e);
  const size_t prefix = std::strlen(kTensorCrcPrefix);
  for (auto it = h.metadata.begin(); it != h.metadata.end();) {
    if (it->first.compare(0, prefix, kTensorCrcPrefix) != 0) {
      ++it;
      continue;
    }
    const std::string name = it->first.substr(prefix);
    auto e = by_name.find(name);
    ENGINE_CHECK(e != by_name.end(), "[safetensors] ", path, ": metadata '", it->first,
                 "' is the checksum of tensor '", name,
                 "', which is not in the file: the header is damaged");
    if (!parse_crc_hex(it->second, e->second->crc))
      bad_value(it->first, it->second, "the CRC-32 of tensor '" + name + "'");
    e->second->has_crc = true;
    it = h.metadata.erase(it);
  }
  bool any = false;
  for (const Entry& e : h.entries) any = any || e.has_crc;
  ENGINE_CHECK(h.checksummed || !any, "[safetensors] ", path,
               ": the tensors have checksums but the metadata has no '", kHeaderCrcKey,
               "': the header is damaged");
  if (h.checksummed)
    for (const Entry& e : h.entries)
      ENGINE_CHECK(e.has_crc, "[safetensors] ", path, ": tensor '", e.name,
                   "' has no checksum (no metadata '", kTensorCrcPrefix, e.name,
                   "') though the file has them: the header is damaged");
}

// Reads and validates the header of an opened file of `file_size` bytes.
Header read_header(const std::string& path, std::ifstream& f, uint64_t file_size) {
  ENGINE_CHECK(
      file_size >= 8, "[safetensors] ", path, ": file is ", file_size,
      " bytes, shorter than the 8-byte header length (truncated or not a safetensors file)");
  unsigned char len_bytes[8];
  read_at(f, path, 0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  ENGINE_CHECK(n <= file_size - 8, "[safetensors] ", path, ": header length ", n,
               " is larger than the ", file_size - 8,
               " bytes after the length field (truncated or not a safetensors file)");
  ENGINE_CHECK(n <= kMaxHeaderBytes, "[safetensors] ", path, ": header length ", n,
               " is larger than the 100 MB limit (truncated or not a safetensors file)");
  std::string text(static_cast<size_t>(n), '\0');
  read_at(f, path, 8, text.data(), n);

  // nlohmann keeps the last of repeated keys; a repeated tensor name is a corrupt file, so note
  // the top-level keys as they are parsed.
  std::unordered_set<std::string> seen;
  std::string duplicate;
  auto note_keys = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key && parsed.is_string() && duplicate.empty() &&
        !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = json::parse(text, note_keys);
  } catch (const json::exception& e) {
    ENGINE_FAIL("[safetensors] ", path, ": header is not valid JSON: ", e.what());
  }
  ENGINE_CHECK(j.is_object(), "[safetensors] ", path, ": header is not a JSON object (it is ",
               j.type_name(), ")");
  ENGINE_CHECK(duplicate.empty(), "[safetensors] ", path, ": header names '", duplicate, "' twice");

  Header h;
  h.data_start = 8 + n;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      ENGINE_CHECK(value.is_object(), "[safetensors] ", path,
                   ": \"__metadata__\" is not an object (it is ", value.type_name(), ")");
      for (const auto& [mk, mv] : value.items()) {
        ENGINE_CHECK(mv.is_string(), "[safetensors] ", path, ": metadata value for key '", mk,
                     "' is not a string (it is ", mv.type_name(), " ", brief(mv), ")");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(path, key, value));
  }

  // The spec requires the entries to tile the data buffer exactly: no overlaps, no holes, nothing
  // after the last tensor. Empty tensors sit between their neighbours at zero width.
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < h.entries.size(); ++i) {
    const Entry& e = h.entries[i];
    if (e.begin < covered) {
      const Entry& prev = h.entries[i - 1];
      ENGINE_FAIL("[safetensors] ", path, ": tensors '", prev.name, "' (bytes [", prev.begin, ", ",
                  prev.end, ")) and '", e.name, "' (bytes [", e.begin, ", ", e.end,
                  ")) overlap in the data buffer");
    }
    ENGINE_CHECK(e.begin == covered, "[safetensors] ", path, ": bytes [", covered, ", ", e.begin,
                 ") of the data buffer belong to no tensor (a hole before '", e.name,
                 "'; the buffer must be covered exactly)");
    covered = e.end;
  }
  uint64_t present = file_size - h.data_start;
  ENGINE_CHECK(covered <= present, "[safetensors] ", path,
               ": truncated file: the header describes ", covered,
               " bytes of tensor data but only ", present, " are present (expected ",
               h.data_start + covered, " bytes in all, the file has ", file_size, ")");
  ENGINE_CHECK(covered == present, "[safetensors] ", path, ": the last ", present - covered,
               " bytes of the data buffer belong to no tensor (the tensors end at ", covered,
               " of ", present, " bytes; the buffer must be covered exactly)");
  read_checksums(path, h);
  return h;
}

Tensor read_tensor(std::ifstream& f, const std::string& path, const Header& h, const Entry& e) {
  Tensor t = Tensor::empty(e.shape, e.dtype);
  read_at(f, path, h.data_start + e.begin, t.raw_data(), e.end - e.begin);
  if (e.has_crc) {
    const uint32_t computed = crc32_of(t.raw_data(), e.end - e.begin);
    ENGINE_CHECK(computed == e.crc, "[safetensors] ", path, ": tensor '", e.name,
                 "' fails its checksum (stored crc32 ", crc_hex(e.crc), ", computed ",
                 crc_hex(computed), "): the file is damaged");
  }
  return t;
}

// ---- writing --------------------------------------------------------------------------------

// The bytes of the header: length field, JSON, spaces up to an 8-byte boundary. The metadata
// gets the checksums: crcs[i] of tensors[i] (0 while the data is not written yet: the length of
// the header does not depend on them) and the header's own.
std::string build_header(const std::string& path, const NamedTensors& tensors,
                         const SafetensorsMetadata& metadata, const std::vector<uint32_t>& crcs) {
  for (const auto& [k, v] : metadata)
    ENGINE_CHECK(k != kHeaderCrcKey && k.rfind(kTensorCrcPrefix, 0) != 0, "[safetensors] ", path,
                 ": metadata key '", k, "' is reserved for the checksums the writer adds");
  std::unordered_set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    ENGINE_CHECK(!name.empty(), "[safetensors] ", path, ": tensor #", i,
                 " has an empty name (names must be unique and non-empty)");
    ENGINE_CHECK(name != "__metadata__", "[safetensors] ", path,
                 ": '__metadata__' is reserved for the metadata and cannot name a tensor");
    ENGINE_CHECK(names.insert(name).second, "[safetensors] ", path, ": tensor name '", name,
                 "' appears twice (names must be unique)");
    ENGINE_CHECK(t.defined(), "[safetensors] ", path, ": tensor '", name, "' is undefined");
  }
  SafetensorsMetadata meta = metadata;
  std::vector<Entry> entries;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    Entry e;
    e.name = name;
    e.dtype_text = st_dtype_name(t.dtype());
    e.shape = t.shape();
    e.begin = offset;
    e.end = offset += t.nbytes();
    entries.push_back(std::move(e));
    meta[kTensorCrcPrefix + name] = crc_hex(i < crcs.size() ? crcs[i] : 0);
  }
  std::string text;
  try {
    const std::string canonical = canonical_header(entries, meta);
    meta[kHeaderCrcKey] = crc_hex(crc32_of(canonical.data(), canonical.size()));
    // ordered_json keeps insertion order, so the header lists tensors in file order.
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : meta) m[k] = v;
    j["__metadata__"] = std::move(m);
    for (const Entry& e : entries)
      j[e.name] = {{"dtype", e.dtype_text}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
    text = j.dump();
  } catch (const json::exception& e) {
    ENGINE_FAIL("[safetensors] ", path, ": tensor names and metadata must be valid UTF-8 (",
                e.what(), ")");
  }
  // The reference implementation pads with spaces so the data starts 8-byte aligned (8 + text
  // is a multiple of 8 when text is), which lets readers map tensors in place.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const SafetensorsMetadata& metadata) {
  // The header goes first with placeholder checksums, the tensors are checksummed as they are
  // streamed out, and the final header (the same length) is written over the placeholder.
  const std::string placeholder = build_header(path, tensors, metadata, {});
  // "<path>.tmp.<pid>", fsync, rename over path, fsync the directory (file_io.h); an error on the
  // way removes the temporary and leaves the previous checkpoint as it was.
  AtomicFile file(path, "safetensors");
  file.write(placeholder.data(), placeholder.size());
  std::vector<uint32_t> crcs;
  std::vector<char> scratch;
  for (const auto& [name, t] : tensors) {
    const char* bytes = nullptr;
    if (t.nbytes() == 0) {
    } else if (t.device().is_cpu() && t.is_contiguous()) {
      bytes = static_cast<const char*>(t.raw_data());
    } else {  // another device or a strided view: gather to host, row-major
      scratch.resize(t.nbytes());
      t.copy_to_host(scratch.data(), t.dtype());
      bytes = scratch.data();
    }
    crcs.push_back(crc32_of(bytes, t.nbytes()));
    if (t.nbytes() > 0) file.write(bytes, t.nbytes());
  }
  const std::string header = build_header(path, tensors, metadata, crcs);
  ENGINE_ASSERT(header.size() == placeholder.size());
  file.write_at(0, header.data(), header.size());
  file.commit();
}

SafetensorsContents load_safetensors(const std::string& path) {
  std::ifstream f;
  uint64_t size = open_for_read(path, f);
  Header h = read_header(path, f, size);
  SafetensorsContents out;
  out.metadata = std::move(h.metadata);
  out.checksummed = h.checksummed;
  out.tensors.reserve(h.entries.size());
  for (const Entry& e : h.entries) out.tensors.emplace_back(e.name, read_tensor(f, path, h, e));
  return out;
}

SafetensorsMetadata read_safetensors_metadata(const std::string& path) {
  std::ifstream f;
  uint64_t size = open_for_read(path, f);
  return read_header(path, f, size).metadata;
}

SafetensorsContents load_safetensors_into(const std::string& path, const NamedTensors& dest,
                                          ExtraTensors extra) {
  std::ifstream f;
  uint64_t size = open_for_read(path, f);
  Header h = read_header(path, f, size);
  std::unordered_map<std::string, const Entry*> by_name;
  for (const Entry& e : h.entries) by_name.emplace(e.name, &e);

  // Every check happens before the first copy, so a mismatch leaves `dest` untouched.
  std::vector<const Entry*> sources;
  std::unordered_set<std::string> wanted;
  for (const auto& [name, t] : dest) {
    ENGINE_CHECK(t.defined(), "[safetensors] ", path, ": destination tensor '", name,
                 "' is undefined");
    ENGINE_CHECK(wanted.insert(name).second, "[safetensors] ", path,
                 ": the destination names tensor '", name, "' twice");
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::string listing;
      constexpr size_t kShown = 10;
      for (size_t i = 0; i < h.entries.size() && i < kShown; ++i)
        listing += (i ? ", " : "") + h.entries[i].name;
      if (h.entries.size() > kShown) listing += " ...";
      ENGINE_FAIL("[safetensors] ", path, ": tensor '", name, "' is missing from the file (it has ",
                  h.entries.size(), " tensors", h.entries.empty() ? "" : ": ", listing, ")");
    }
    const Entry& e = *it->second;
    ENGINE_CHECK(e.shape == t.shape(), "[safetensors] ", path, ": tensor '", name, "' has shape ",
                 shape_str(e.shape), " in the file but ", shape_str(t.shape()), " in the model");
    ENGINE_CHECK(e.dtype == t.dtype(), "[safetensors] ", path, ": tensor '", name, "' has dtype ",
                 dtype_name(e.dtype), " in the file but ", dtype_name(t.dtype()),
                 " in the model (load_safetensors_into converts nothing)");
    sources.push_back(&e);
  }
  if (extra == ExtraTensors::error)
    for (const Entry& e : h.entries)
      ENGINE_CHECK(wanted.count(e.name), "[safetensors] ", path, ": tensor '", e.name,
                   "' is in the file but not in the model (pass allow_extra to ignore it)");

  NoGrad no_grad;
  for (size_t i = 0; i < dest.size(); ++i)
    dest[i].second.copy_(read_tensor(f, path, h, *sources[i]));
  SafetensorsContents rest;
  rest.metadata = std::move(h.metadata);
  rest.checksummed = h.checksummed;
  for (const Entry& e : h.entries) {
    if (wanted.count(e.name)) continue;
    if (extra == ExtraTensors::read)
      rest.tensors.emplace_back(e.name, read_tensor(f, path, h, e));
    else
      rest.skipped.push_back(e.name);
  }
  return rest;
}

}  // namespace engine
