#include "engine/npy.h"

#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>

#include "engine/error.h"
#include "engine/file_io.h"

namespace engine {

namespace {

constexpr char kMagic[] = "\x93NUMPY";

const char* descr_of(DType t) {
  switch (t) {
    case DType::f32:
    case DType::bf16:
      return "<f4";
    case DType::f64:
      return "<f8";
    case DType::f16:
      return "<f2";
    case DType::i32:
      return "<i4";
    case DType::i64:
      return "<i8";
    case DType::u8:
      return "|u1";
  }
  return "";
}

}  // namespace

void save_npy(const std::string& path, const Tensor& t) {
  ENGINE_CHECK(t.defined(), "[npy] ", path, ": no tensor to write");
  const DType as = t.dtype() == DType::bf16 ? DType::f32 : t.dtype();
  std::string shape = "(";
  for (int64_t i = 0; i < t.dim(); ++i)
    shape += std::to_string(t.size(i)) + (t.dim() == 1 ? "," : i + 1 < t.dim() ? ", " : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr_of(as) +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  ENGINE_CHECK(header.size() < 65536, "[npy] ", path, ": shape too long for a version 1.0 header");
  std::string bytes(kMagic, 6);
  bytes += '\x01';
  bytes += '\x00';
  bytes += char(header.size() & 0xff);
  bytes += char(header.size() >> 8);
  bytes += header;
  const size_t offset = bytes.size();
  bytes.resize(offset + size_t(t.numel()) * dtype_size(as));
  if (t.numel() > 0) t.copy_to_host(bytes.data() + offset, as);
  write_file_atomic(path, bytes, "npy");
}

Tensor load_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in.good(), "[npy] ", path, ": cannot open");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ENGINE_CHECK(bytes.size() >= 10 && bytes.compare(0, 6, kMagic, 6) == 0, "[npy] ", path,
               ": not a .npy file (expected the magic \\x93NUMPY)");
  const int major = static_cast<unsigned char>(bytes[6]);
  ENGINE_CHECK(major == 1 || major == 2 || major == 3, "[npy] ", path,
               ": unsupported format version ", major);
  size_t len = 0, start = 10;
  if (major == 1) {
    len = size_t(static_cast<unsigned char>(bytes[8])) |
          size_t(static_cast<unsigned char>(bytes[9])) << 8;
  } else {
    ENGINE_CHECK(bytes.size() >= 12, "[npy] ", path, ": truncated header");
    for (int i = 0; i < 4; ++i)
      len |= size_t(static_cast<unsigned char>(bytes[size_t(8 + i)])) << (8 * i);
    start = 12;
  }
  ENGINE_CHECK(bytes.size() >= start + len, "[npy] ", path, ": truncated header (", len,
               " bytes announced)");
  const std::string header = bytes.substr(start, len);
  // Compiled once: building a std::regex costs more than matching a header.
  static const std::regex kDescr("'descr':\\s*'([<>|=]?[a-zA-Z]\\d+)'"),
      kFortran("'fortran_order':\\s*(True|False)"), kShape("'shape':\\s*\\(([^)]*)\\)"),
      kDigits("\\d+");
  std::smatch m;
  ENGINE_CHECK(std::regex_search(header, m, kDescr), "[npy] ", path,
               ": header has no 'descr': ", header);
  const std::string descr = m[1];
  DType dt;
  if (descr == "<f4")
    dt = DType::f32;
  else if (descr == "<f8")
    dt = DType::f64;
  else if (descr == "<f2")
    dt = DType::f16;
  else if (descr == "<i4")
    dt = DType::i32;
  else if (descr == "<i8")
    dt = DType::i64;
  else if (descr == "|u1" || descr == "<u1")
    dt = DType::u8;
  else
    ENGINE_FAIL("[npy] ", path, ": dtype '", descr,
                "' is not supported (expected <f4, <f8, <f2, <i4, <i8 or |u1)");
  ENGINE_CHECK(std::regex_search(header, m, kFortran) && m[1] == "False", "[npy] ", path,
               ": expected 'fortran_order': False (C order)");
  ENGINE_CHECK(std::regex_search(header, m, kShape), "[npy] ", path,
               ": header has no 'shape': ", header);
  Shape shape;
  const std::string dims = m[1];
  // A hostile header can hold any digits: each dimension, the element count and the byte size
  // must fit (else the size check below could pass on a wrapped value).
  int64_t numel = 1;
  for (std::sregex_iterator it(dims.begin(), dims.end(), kDigits), end; it != end; ++it) {
    const std::string d = it->str();
    int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
    ENGINE_CHECK(ec == std::errc() && !__builtin_mul_overflow(numel, v, &numel), "[npy] ", path,
                 ": shape (", dims, ") is too large");
    shape.push_back(v);
  }
  size_t body = 0;
  ENGINE_CHECK(!__builtin_mul_overflow(size_t(numel), dtype_size(dt), &body), "[npy] ", path,
               ": shape (", dims, ") is too large");
  ENGINE_CHECK(bytes.size() - start - len == body, "[npy] ", path, ": data is ",
               bytes.size() - start - len, " bytes, expected ", body, " for shape (", dims, ") of ",
               descr);
  return Tensor::from_host(bytes.data() + start + len, dt, shape);
}

}  // namespace engine
