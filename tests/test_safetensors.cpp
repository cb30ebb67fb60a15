// safetensors checkpoints: round trips, the byte layout the spec fixes, a file laid out the way
// Python's safetensors writes it, and a clear engine::Error (never a crash) for every kind of
// corrupt or truncated file; loading into a model's parameters; the atomic write.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>

#include "engine/safetensors.h"
#include "ops/ops.h"
#include "test_support.h"

using namespace engine;
using Catch::Contains;
namespace fs = std::filesystem;

using engine::testing::TempDir;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.is_open());
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

uint64_t read_le64(const std::string& s) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(s[i]);
  return n;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A file as Python's safetensors lays it out: header length, the JSON padded with spaces to a
// multiple of 8, the data buffer.
std::string st_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

// A tensor's elements as row-major host bytes, in its own dtype.
std::string host_bytes(const Tensor& t) {
  std::string s(t.nbytes(), '\0');
  t.copy_to_host(s.data(), t.dtype());
  return s;
}

}  // namespace

TEST_CASE("save and load round-trip every dtype, scalars, empty tensors, views and metadata",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  Generator g(11);
  Tensor base = Tensor::randn({3, 4}, g, 0, 1, DType::f64);
  NamedTensors saved = {
      {"f32", Tensor::randn({2, 3}, g)},
      {"f64", base},
      {"bf16", Tensor::randn({3, 2}, g).to(DType::bf16)},
      {"f16", Tensor::randn({5}, g).to(DType::f16)},
      {"i32", Tensor::from_vector<int32_t>({-7, 0, 2147483647, -2147483647 - 1}, {2, 2})},
      {"i64", Tensor::from_vector<int64_t>({int64_t(1) << 40, -3}, {2})},
      {"u8", Tensor::from_vector<uint8_t>({0, 1, 127, 255}, {4})},
      {"scalar", Tensor::scalar(3.5)},
      {"empty", Tensor::zeros({0, 4})},
      {"transposed", base.to(DType::f32).transpose(0, 1)},  // strides (1, 4)
      {"encoder.layer.0.attn.qkv.weight", Tensor::randn({6, 2}, g)},
  };
  REQUIRE_FALSE(saved[9].second.is_contiguous());
  SafetensorsMetadata meta = {{"format", "pt"}, {"step", "1200"}, {"note", "ünïcode ok"}};
  save_safetensors(path, saved, meta);

  SafetensorsContents c = load_safetensors(path);
  REQUIRE(c.metadata == meta);
  REQUIRE(read_safetensors_metadata(path) == meta);
  REQUIRE(c.tensors.size() == saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {  // written in the order given = data-offset order
    const auto& [name, want] = saved[i];
    const auto& [got_name, got] = c.tensors[i];
    INFO(name);
    REQUIRE(got_name == name);
    REQUIRE(got.device().is_cpu());
    REQUIRE(got.dtype() == want.dtype());
    REQUIRE(got.shape() == want.shape());
    REQUIRE(got.is_contiguous());
    REQUIRE_FALSE(got.requires_grad());
    REQUIRE(host_bytes(got) == host_bytes(want));  // bit-exact
  }
  REQUIRE(c.tensors[7].second.item() == 3.5);
  REQUIRE(c.tensors[7].second.dim() == 0);
  REQUIRE(c.tensors[8].second.numel() == 0);
  REQUIRE(c.tensors[9].second.to_vector<float>() ==
          base.transpose(0, 1).contiguous().to(DType::f32).to_vector<float>());

  // No tensors and no metadata is a valid file too.
  save_safetensors(path, {});
  SafetensorsContents none = load_safetensors(path);
  REQUIRE(none.tensors.empty());
  REQUIRE(none.metadata.empty());
}

TEST_CASE("the file layout follows the spec byte for byte", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("layout.safetensors");
  std::vector<float> a = {1.0f, -2.5f};
  std::vector<int64_t> b = {3, -4, 5};
  save_safetensors(path,
                   {{"a", Tensor::from_vector(a, {2})}, {"b", Tensor::from_vector(b, {3, 1})}},
                   {{"k", "v"}});
  std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = read_le64(bytes);
  REQUIRE((8 + n) % 8 == 0);  // the data starts 8-byte aligned
  REQUIRE(bytes.size() == 8 + n + 8 + 24);
  std::string header = bytes.substr(8, n);
  // Compact JSON, then only spaces (at most 7) up to the aligned data start.
  size_t close = header.find_last_of('}');
  REQUIRE(header.front() == '{');
  REQUIRE(header.size() - close - 1 < 8);
  REQUIRE(header.find_first_not_of(' ', close + 1) == std::string::npos);
  // The checksums (docs/checkpoint.md): zlib's CRC-32 of each tensor's bytes, and of the header's
  // canonical form (sorted keys, compact, without the header checksum itself) — values computed
  // with Python's zlib.crc32 over these bytes and
  // {"__metadata__":{"engine.crc32.a":"560302f4","engine.crc32.b":"0d9954a4","k":"v"},
  //  "a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]},
  //  "b":{"data_offsets":[8,32],"dtype":"I64","shape":[3,1]}} (no spaces).
  REQUIRE(header.substr(0, close + 1) ==
          R"({"__metadata__":{"engine.crc32.a":"560302f4","engine.crc32.b":"0d9954a4",)"
          R"("engine.header_crc32":"146d211f","k":"v"},)"
          R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
          R"("b":{"dtype":"I64","shape":[3,1],"data_offsets":[8,32]}})");
  // Row-major little-endian values (this host is little-endian, as the library requires).
  REQUIRE(bytes.substr(8 + n, 8) == bytes_of(a));
  REQUIRE(bytes.substr(8 + n + 8) == bytes_of(b));
}

TEST_CASE("a file laid out the way Python's safetensors writes it loads", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("from_python.safetensors");
  // Python's writer orders the buffer by dtype size then name and lists the header keys by name,
  // so key order and data order differ; BOOL is one byte per element.
  std::vector<int64_t> step = {42};
  std::vector<float> weight = {1, 2, 3, 4};
  std::vector<uint16_t> bias = {0x3F80, 0xC000};  // bf16 1.0, -2.0
  std::vector<uint8_t> mask = {1, 0, 1};
  std::string header = R"({"__metadata__":{"format":"pt"},)"
                       R"("bias":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},)"
                       R"("mask":{"dtype":"BOOL","shape":[3],"data_offsets":[28,31]},)"
                       R"("step":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                       R"("weight":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}})";
  write_bytes(path,
              st_file(header, bytes_of(step) + bytes_of(weight) + bytes_of(bias) + bytes_of(mask)));

  SafetensorsContents c = load_safetensors(path);
  REQUIRE(c.metadata == SafetensorsMetadata{{"format", "pt"}});
  REQUIRE(c.tensors.size() == 4);
  REQUIRE(c.tensors[0].first == "step");  // data-offset order
  REQUIRE(c.tensors[1].first == "weight");
  REQUIRE(c.tensors[2].first == "bias");
  REQUIRE(c.tensors[3].first == "mask");
  REQUIRE(c.tensors[0].second.dtype() == DType::i64);
  REQUIRE(c.tensors[0].second.dim() == 0);
  REQUIRE(c.tensors[0].second.item() == 42);
  REQUIRE(c.tensors[1].second.shape() == Shape{2, 2});
  REQUIRE(c.tensors[1].second.to_vector<float>() == weight);
  REQUIRE(c.tensors[2].second.dtype() == DType::bf16);
  REQUIRE(c.tensors[2].second.to_vector<float>() == std::vector<float>{1.0f, -2.0f});
  REQUIRE(c.tensors[3].second.dtype() == DType::u8);  // BOOL loads as u8
  REQUIRE(c.tensors[3].second.to_vector<uint8_t>() == mask);

  // Unpadded headers and a header with no "__metadata__" are valid too.
  std::string h2 = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  write_bytes(path, le64(h2.size()) + h2 + bytes_of(std::vector<float>{7}));
  REQUIRE(load_safetensors(path).tensors[0].second.item() == 7);
  REQUIRE(read_safetensors_metadata(path).empty());
}

TEST_CASE("corrupt headers are errors that name the file and the problem", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const std::string d8(8, '\0');
  auto f32 = [](const std::string& shape, const std::string& offsets) {
    return R"({"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
  };
  struct Case {
    std::string header, data, expected;
  };
  std::vector<Case> cases = {
      {R"({"a":)", d8, "header is not valid JSON: [json.exception.parse_error"},
      {"\x01\x02", d8, "header is not valid JSON"},
      {R"([1,2])", d8, "header is not a JSON object (it is array)"},
      {R"({"a":3})", d8, "entry 'a' is not an object (it is number)"},
      {R"({"a":{"shape":[2],"data_offsets":[0,8]}})", d8, "tensor 'a' has no \"dtype\" field"},
      {R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", d8,
       "tensor 'a': \"dtype\" is number, expected a string such as \"F32\""},
      {R"({"a":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", d8,
       "tensor 'a' has unknown dtype 'F8_E4M3'"},
      {R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", d8, "tensor 'a' has no \"shape\" field"},
      {R"({"a":)" + f32(R"("2")", "[0,8]") + "}", d8,
       "tensor 'a': \"shape\" is string, expected an array of non-negative integers"},
      {R"({"a":)" + f32("[2.0]", "[0,8]") + "}", d8, "has a non-integer entry 2.0"},
      {R"({"a":)" + f32("[[2]]", "[0,8]") + "}", d8, "has a non-integer entry [2]"},
      {R"({"a":)" + f32("[-2]", "[0,8]") + "}", d8, "tensor 'a' has negative dimension -2"},
      {R"({"a":)" + f32("[18446744073709551615]", "[0,8]") + "}", d8, "is too large"},
      {R"({"a":)" + f32("[4294967296,4294967296,4]", "[0,8]") + "}", d8,
       "the element count of shape [4294967296,4294967296,4] overflows 64 bits"},
      {R"({"a":)" + f32("[2305843009213693952]", "[0,8]") + "}", d8,
       "the byte size of shape [2305843009213693952] of F32 overflows 64 bits"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", d8, "tensor 'a' has no \"data_offsets\" field"},
      {R"({"a":)" + f32("[2]", "[8]") + "}", d8,
       "\"data_offsets\" is [8], expected [begin, end] with non-negative integers"},
      {R"({"a":)" + f32("[2]", "[-1,7]") + "}", d8, "expected [begin, end]"},
      {R"({"a":)" + f32("[2]", R"("0,8")") + "}", d8, "expected [begin, end]"},
      {R"({"a":)" + f32("[2]", "[8,0]") + "}", d8,
       "tensor 'a' has data_offsets [8, 0]: end is before begin"},
      {R"({"a":)" + f32("[3]", "[0,8]") + "}", d8,
       "tensor 'a' has data_offsets [0, 8] spanning 8 bytes but shape (3) of F32 needs 12 bytes"},
      {R"({"a":)" + f32("[2]", "[0,8]") + R"(,"b":)" + f32("[2]", "[4,12]") + "}",
       std::string(12, '\0'),
       "tensors 'a' (bytes [0, 8)) and 'b' (bytes [4, 12)) overlap in the data buffer"},
      {R"({"a":)" + f32("[1]", "[0,4]") + R"(,"b":)" + f32("[1]", "[8,12]") + "}",
       std::string(12, '\0'), "bytes [4, 8) of the data buffer belong to no tensor"},
      {R"({"a":)" + f32("[1]", "[4,8]") + "}", d8,
       "bytes [0, 4) of the data buffer belong to no tensor"},
      {R"({"a":)" + f32("[1]", "[0,4]") + "}", d8,
       "the last 4 bytes of the data buffer belong to no tensor"},
      {R"({"a":)" + f32("[4]", "[0,16]") + "}", d8,
       "truncated file: the header describes 16 bytes of tensor data but only 8 are present"},
      {R"({"a":)" + f32("[2]", "[0,8]") + R"(,"a":)" + f32("[2]", "[0,8]") + "}", d8,
       "header names 'a' twice"},
      {R"({"__metadata__":{"step":100},"a":)" + f32("[2]", "[0,8]") + "}", d8,
       "metadata value for key 'step' is not a string (it is number 100)"},
      {R"({"__metadata__":["x"],"a":)" + f32("[2]", "[0,8]") + "}", d8,
       "\"__metadata__\" is not an object (it is array)"},
  };
  for (const Case& c : cases) {
    INFO(c.header);
    write_bytes(path, st_file(c.header, c.data));
    REQUIRE_THROWS_WITH(load_safetensors(path),
                        Contains("[safetensors] " + path + ": ") && Contains(c.expected));
    REQUIRE_THROWS_WITH(read_safetensors_metadata(path), Contains(c.expected));
    REQUIRE_THROWS_WITH(load_safetensors_into(path, {}), Contains(c.expected));
  }
}

TEST_CASE("unreadable, short and oversized files are errors, not allocations", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("short.safetensors");
  REQUIRE_THROWS_WITH(load_safetensors(dir.file("nope.safetensors")),
                      Contains("nope.safetensors: cannot open file (No such file or directory)"));
  REQUIRE_THROWS_WITH(load_safetensors(dir.path.string()), Contains("is a directory"));

  write_bytes(path, "abcde");
  REQUIRE_THROWS_WITH(load_safetensors(path),
                      Contains("file is 5 bytes, shorter than the 8-byte header length") &&
                          Contains("truncated or not a safetensors file"));
  // A length field pointing past the end of the file (e.g. text that is not a safetensors file).
  write_bytes(path, "this is not a checkpoint");
  REQUIRE_THROWS_WITH(load_safetensors(path),
                      Contains("is larger than the 16 bytes after the length field") &&
                          Contains("truncated or not a safetensors file"));
  write_bytes(path, le64(uint64_t(1) << 62) + "{}");
  REQUIRE_THROWS_WITH(load_safetensors(path), Contains("truncated or not a safetensors file"));
  // A file long enough to back a 200 MB header is still refused (a sparse file: no disk used).
  write_bytes(path, le64(200'000'000) + "{}");
  fs::resize_file(path, 8 + 200'000'000);
  REQUIRE_THROWS_WITH(load_safetensors(path),
                      Contains("header length 200000000 is larger than the 100 MB limit"));
}

TEST_CASE("every truncation and many byte corruptions of a valid file throw, never crash",
          "[safetensors]") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  const std::string bad = dir.file("bad.safetensors");
  Generator g(5);
  save_safetensors(good,
                   {{"w", Tensor::randn({3, 2}, g)},
                    {"b", Tensor::randn({2}, g).to(DType::bf16)},
                    {"e", Tensor::zeros({0})},
                    {"n", Tensor::from_vector<int64_t>({1, 2}, {2})}},
                   {{"epoch", "3"}});
  const std::string bytes = read_bytes(good);
  for (size_t len = 0; len < bytes.size(); ++len) {
    INFO("truncated to " << len << " of " << bytes.size() << " bytes");
    write_bytes(bad, bytes.substr(0, len));
    REQUIRE_THROWS_AS(load_safetensors(bad), engine::Error);
    REQUIRE_THROWS_AS(read_safetensors_metadata(bad), engine::Error);
  }
  // Overwriting single header bytes: either still a valid file or an engine::Error.
  const uint64_t n = read_le64(bytes);
  for (size_t pos = 0; pos < 8 + n; ++pos) {
    for (char ch : {'\0', '\xff', '[', '{', '"', '9', '-', ' ', ','}) {
      std::string b = bytes;
      b[pos] = ch;
      write_bytes(bad, b);
      try {
        load_safetensors(bad);
      } catch (const engine::Error& e) {
        REQUIRE(std::string(e.what()).rfind("[safetensors] " + bad + ": ", 0) == 0);
      }
    }
  }
}

TEST_CASE("checksums: a truncated or damaged checkpoint is refused naming the file and what",
          "[safetensors][checksum]") {
  TempDir dir;
  const std::string good = dir.file("step_00000003.safetensors");
  const std::string bad = dir.file("bad.safetensors");
  Generator g(9);
  // A training checkpoint in miniature: weights, optimizer moments, a counter, a model config.
  const NamedTensors saved = {
      {"bert.encoder.layer.0.ffn.fc1.weight", Tensor::randn({64, 16}, g)},
      {"bert.encoder.layer.0.ffn.fc1.bias", Tensor::randn({64}, g)},
      {"optim.m.bert.encoder.layer.0.ffn.fc1.weight", Tensor::randn({64, 16}, g)},
      {"optim.v.bert.encoder.layer.0.ffn.fc1.weight", Tensor::randn({64, 16}, g)},
      {"trainer.step", Tensor::from_vector<int64_t>({3}, {})},
  };
  const SafetensorsMetadata meta = {
      {"engine.model_config", R"({"hidden_size": 16, "hidden_dropout": 0.1})"}, {"format", "pt"}};
  save_safetensors(good, saved, meta);
  const std::string bytes = read_bytes(good);
  const uint64_t n = read_le64(bytes);
  const size_t data = 8 + n;
  const size_t weight = data, moment = data + 64 * 16 * 4 + 64 * 4;

  // Untouched, it loads bit for bit, verified, and the checksums stay out of the metadata.
  const SafetensorsContents c = load_safetensors(good);
  REQUIRE(c.checksummed);
  REQUIRE(c.metadata == meta);
  REQUIRE(read_safetensors_metadata(good) == meta);
  for (size_t i = 0; i < saved.size(); ++i)
    REQUIRE(host_bytes(c.tensors[i].second) == host_bytes(saved[i].second));

  auto refused = [&](const std::string& b, const std::string& what) {
    write_bytes(bad, b);
    REQUIRE_THROWS_WITH(load_safetensors(bad),
                        Contains("[safetensors] " + bad + ": ") && Contains(what));
  };
  SECTION("truncated inside the length, the header, a weight, the optimizer state") {
    refused(bytes.substr(0, 5), "shorter than the 8-byte header length");
    refused(bytes.substr(0, 8 + n / 2), "header length");
    refused(bytes.substr(0, weight + 100), "truncated file");
    refused(bytes.substr(0, moment + 7), "truncated file");
    refused(bytes.substr(0, bytes.size() - 1), "truncated file");
  }
  SECTION("a flipped byte in a weight or in the optimizer state names the tensor") {
    std::string b = bytes;
    b[weight + 123] ^= 0x10;
    refused(b, "tensor 'bert.encoder.layer.0.ffn.fc1.weight' fails its checksum (stored crc32 ");
    b = bytes;
    b[moment + 64 * 16 * 4 - 1] ^= 0x01;  // the last byte of the first moment
    refused(b, "tensor 'optim.m.bert.encoder.layer.0.ffn.fc1.weight' fails its checksum");
    b = bytes;
    b[bytes.size() - 8] ^= 0x80;  // the step counter
    refused(b, "tensor 'trainer.step' fails its checksum");
    REQUIRE_THROWS_WITH(
        load_safetensors_into(bad, {{"trainer.step", Tensor::zeros({}, DType::i64)}},
                              ExtraTensors::skip),
        Contains("tensor 'trainer.step' fails its checksum") && Contains("): the file is damaged"));
  }
  SECTION("a flipped byte in the header: in the config, a tensor name, a checksum") {
    // (anchor, offset of the byte to change from the anchor's start, its new value)
    const std::tuple<std::string, size_t, char> flips[] = {
        {"0.1}", 2, '9'},                 // hidden_dropout 0.1 -> 0.9: still a valid config
        {"fc1.bias\":{", 4, 'c'},         // a tensor's name: "fc1.cias"
        {"step\":\"", 7, '0'},            // the first digit of the step counter's checksum
        {"header_crc32\":\"", 15, '0'}};  // ... and of the header's
    for (const auto& [anchor, offset, value] : flips) {
      INFO(anchor);
      const size_t pos = bytes.find(anchor, 8);
      REQUIRE(pos < data);
      std::string b = bytes;
      b[pos + offset] = b[pos + offset] == value ? char(value + 1) : value;
      refused(b, "the header fails its checksum (stored crc32 ");
      REQUIRE_THROWS_WITH(read_safetensors_metadata(bad), Contains("fails its checksum"));
    }
  }
  SECTION("every single changed byte of the header is refused") {
    const size_t json_end = bytes.find_last_of('}', 8 + n);
    for (size_t pos = 0; pos <= json_end; ++pos) {
      std::string b = bytes;
      b[pos] ^= 0x40;  // ' ' -> '`', '"' -> 'b', digits -> letters, letters -> other letters
      INFO("byte " << pos << " '" << bytes[pos] << "'");
      write_bytes(bad, b);
      REQUIRE_THROWS_AS(load_safetensors(bad), engine::Error);
    }
  }
  SECTION("checksum metadata that is not valid is a clear error") {
    // Hand-written files without a header checksum, so the tensor checksums are read as given.
    const std::string w = bytes_of(std::vector<float>{1, 2});
    auto file = [&](const std::string& crc_entries) {
      return st_file(R"({"__metadata__":{)" + crc_entries +
                         R"(},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                     w);
    };
    refused(file(R"("engine.crc32.w":"xyz")"),
            "metadata 'engine.crc32.w' is \"xyz\", expected 8 lowercase hex digits (the CRC-32 of "
            "tensor 'w'): the header is damaged");
    refused(file(R"("engine.crc32.w":"0BADF00D")"), "expected 8 lowercase hex digits");
    refused(file(R"("engine.crc32.v":"00000000")"),
            "metadata 'engine.crc32.v' is the checksum of tensor 'v', which is not in the file");
    refused(file(R"("engine.crc32.w":"00000000","engine.header_crc32":"12")"),
            "metadata 'engine.header_crc32' is \"12\", expected 8 lowercase hex digits");
    // Checksums come all together: a lost (renamed) key cannot turn verification off.
    refused(file(R"("engine.crc32.w":"2e3fa576")"),
            "the tensors have checksums but the metadata has no 'engine.header_crc32'");
    refused(file(R"("engine.header_crc32":"00000000")"), "the header fails its checksum");
    // No checksums at all (Hugging Face files, older checkpoints) load unverified.
    write_bytes(bad, file(""));
    REQUIRE_FALSE(load_safetensors(bad).checksummed);
  }
  SECTION("the checksum keys are the writer's") {
    REQUIRE_THROWS_WITH(save_safetensors(bad, {}, {{"engine.crc32.x", "00000000"}}),
                        Contains("metadata key 'engine.crc32.x' is reserved"));
    REQUIRE_THROWS_WITH(save_safetensors(bad, {}, {{"engine.header_crc32", "00000000"}}),
                        Contains("is reserved for the checksums"));
  }
}

TEST_CASE("load_safetensors_into fills a model's parameters and names the first mismatch",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("model.st");
  Generator g(9);
  Tensor w = Tensor::randn({4, 3}, g), b = Tensor::randn({4}, g);
  Tensor h = Tensor::randn({2}, g, 0, 1, DType::f64);
  save_safetensors(path, {{"encoder.w", w}, {"encoder.b", b}, {"head", h}});

  auto params = [](std::vector<std::pair<std::string, Tensor>> ps) {
    for (auto& [n, t] : ps) t.set_requires_grad(true);  // like a model's named_parameters()
    return ps;
  };
  // Loads into parameters that require grad, whatever their layout (a transposed view too).
  Tensor dw = Tensor::zeros({3, 4}).transpose(0, 1);
  NamedTensors dest = params({{"head", Tensor::zeros({2}, DType::f64)},
                              {"encoder.w", Tensor::zeros({4, 3})},
                              {"encoder.b", Tensor::zeros({4})}});
  load_safetensors_into(path, dest);
  REQUIRE(dest[0].second.to_vector<double>() == h.to_vector<double>());
  REQUIRE(dest[1].second.to_vector<float>() == w.to_vector<float>());
  REQUIRE(dest[2].second.to_vector<float>() == b.to_vector<float>());
  REQUIRE(dest[1].second.requires_grad());
  REQUIRE(GradMode::is_enabled());
  load_safetensors_into(path, {{"encoder.w", dw}}, ExtraTensors::read);
  REQUIRE(dw.to_vector<float>() == w.to_vector<float>());

  // Shape: the first mismatch in the destination's order is the one named; nothing is written.
  NamedTensors wrong = params({{"encoder.w", Tensor::zeros({3, 4})},
                               {"encoder.b", Tensor::zeros({5})},
                               {"head", Tensor::zeros({2}, DType::f64)}});
  REQUIRE_THROWS_WITH(load_safetensors_into(path, wrong),
                      Contains("[safetensors] " + path +
                               ": tensor 'encoder.w' has shape (4, 3) in the file but (3, 4) in "
                               "the model"));
  REQUIRE(wrong[2].second.to_vector<double>() == std::vector<double>{0, 0});
  wrong[0].second = Tensor::zeros({4, 3});
  REQUIRE_THROWS_WITH(
      load_safetensors_into(path, wrong),
      Contains("tensor 'encoder.b' has shape (4) in the file but (5) in the model"));
  // Dtype: nothing is converted.
  REQUIRE_THROWS_WITH(
      load_safetensors_into(path, params({{"head", Tensor::zeros({2})}}), ExtraTensors::read),
      Contains("tensor 'head' has dtype f64 in the file but f32 in the model"));
  // Missing: the message lists what the file has.
  REQUIRE_THROWS_WITH(
      load_safetensors_into(path, params({{"encoder.w", Tensor::zeros({4, 3})},
                                          {"decoder.w", Tensor::zeros({4, 3})}})),
      Contains("tensor 'decoder.w' is missing from the file (it has 3 tensors: encoder.w, "
               "encoder.b, head)"));
  // Extra: refused unless allowed.
  NamedTensors partial =
      params({{"encoder.w", Tensor::zeros({4, 3})}, {"encoder.b", Tensor::zeros({4})}});
  REQUIRE_THROWS_WITH(load_safetensors_into(path, partial),
                      Contains("tensor 'head' is in the file but not in the model (pass "
                               "allow_extra to ignore it)"));
  REQUIRE(partial[0].second.to_vector<float>() == std::vector<float>(12, 0.0f));
  load_safetensors_into(path, partial, ExtraTensors::read);
  REQUIRE(partial[0].second.to_vector<float>() == w.to_vector<float>());

  // A Module's parameters, end to end.
  struct Tiny : Module {
    Tensor weight = register_parameter("weight", Tensor::zeros({4, 3}));
  } tiny;
  Module root;
  root.register_module("encoder", tiny);
  save_safetensors(path, {{"encoder.weight", w}});
  load_safetensors_into(path, root.named_parameters());
  REQUIRE(tiny.weight.to_vector<float>() == w.to_vector<float>());

  // A long listing is cut short.
  NamedTensors many;
  for (int i = 0; i < 23; ++i) many.emplace_back("t" + std::to_string(i), Tensor::zeros({1}));
  save_safetensors(path, many);
  REQUIRE_THROWS_WITH(load_safetensors_into(path, {{"x", Tensor::zeros({1})}}),
                      Contains("is missing from the file (it has 23 tensors: t0, t1, t2, t3, t4, "
                               "t5, t6, t7, t8, t9 ...)"));
}

TEST_CASE("saving is atomic, overwrites, and checks names", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  write_bytes(path, "an older, longer file that is about to be replaced by the checkpoint....");
  save_safetensors(path, {{"x", Tensor::full({2}, 1.5)}});
  REQUIRE(load_safetensors(path).tensors[0].second.to_vector<float>() ==
          std::vector<float>{1.5f, 1.5f});
  save_safetensors(path, {{"y", Tensor::full({3}, 2.0)}});
  SafetensorsContents c = load_safetensors(path);
  REQUIRE(c.tensors.size() == 1);
  REQUIRE(c.tensors[0].first == "y");
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename());
    return names;
  };
  REQUIRE(listing() == std::vector<std::string>{"ckpt.safetensors"});  // no .tmp left behind

  // Bad names are refused before anything is written; the old file stays intact.
  const std::string before = read_bytes(path);
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"", Tensor::zeros({1})}}),
                      Contains("[safetensors] " + path + ": tensor #0 has an empty name"));
  REQUIRE_THROWS_WITH(
      save_safetensors(path, {{"a", Tensor::zeros({1})}, {"a", Tensor::zeros({1})}}),
      Contains("tensor name 'a' appears twice"));
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"__metadata__", Tensor::zeros({1})}}),
                      Contains("'__metadata__' is reserved"));
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"u", Tensor()}}),
                      Contains("tensor 'u' is undefined"));
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"bad\xff", Tensor::zeros({1})}}),
                      Contains("must be valid UTF-8"));
  REQUIRE(read_bytes(path) == before);
  REQUIRE(listing() == std::vector<std::string>{"ckpt.safetensors"});

  // An unwritable destination names the temporary file it could not create.
  REQUIRE_THROWS_WITH(
      save_safetensors(dir.file("no/such/dir/x.safetensors"), {}),
      Contains("cannot create the temporary file") && Contains("No such file or directory"));
}
