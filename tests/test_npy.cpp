// engine/npy.h: the .npy layout NumPy writes (header padded to 64 bytes), round trips, and errors.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>

#include "engine/npy.h"
#include "test_support.h"

using Catch::Contains;
using engine::DType;
using engine::Tensor;

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
}  // namespace

TEST_CASE("npy: the header NumPy writes, padded to 64 bytes", "[npy]") {
  engine::testing::TempDir dir;
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  engine::save_npy(dir / "a.npy", t);
  const std::string bytes = read_all(dir / "a.npy");
  // numpy.save(np.arange(1, 7, dtype='<f4').reshape(2, 3)) writes exactly this header.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  header.append(128 - 10 - header.size() - 1, ' ');  // 10 + 59 + 1 rounded up to 128
  header += '\n';
  REQUIRE(bytes.size() == 128 + 6 * 4);
  CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  CHECK(static_cast<unsigned char>(bytes[8]) == header.size());
  CHECK(bytes.substr(10, header.size()) == header);
  float v[6];
  std::memcpy(v, bytes.data() + 128, sizeof v);
  CHECK(v[0] == 1.f);
  CHECK(v[5] == 6.f);
}

TEST_CASE("npy: round trips of every dtype, a strided view and a 1-d shape", "[npy]") {
  engine::testing::TempDir dir;
  Tensor f =
      Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);  // (3, 2), strided
  engine::save_npy(dir / "f.npy", f);
  Tensor back = engine::load_npy(dir / "f.npy");
  CHECK(back.shape() == engine::Shape{3, 2});
  CHECK(back.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});

  Tensor i = Tensor::from_vector<int64_t>({-3, 7, 1LL << 40}, {3});
  engine::save_npy(dir / "i.npy", i);
  CHECK(read_all(dir / "i.npy").find("'shape': (3,), }") != std::string::npos);
  Tensor ib = engine::load_npy(dir / "i.npy");
  CHECK(ib.dtype() == DType::i64);
  CHECK(ib.to_vector<int64_t>() == std::vector<int64_t>{-3, 7, 1LL << 40});

  Tensor d = Tensor::from_vector<double>({0.1, -2.5}, {1, 2});
  engine::save_npy(dir / "d.npy", d);
  Tensor db = engine::load_npy(dir / "d.npy");
  CHECK(db.dtype() == DType::f64);
  CHECK(db.to_vector<double>() == std::vector<double>{0.1, -2.5});
}

TEST_CASE("npy: malformed files name the file and what was expected", "[npy]") {
  engine::testing::TempDir dir;
  using engine::testing::error_of;
  CHECK_THAT(error_of([&] { engine::load_npy(dir / "none.npy"); }),
             Contains("none.npy: cannot open"));
  const std::string junk = dir.write("junk.npy", "PK\x03\x04 not numpy");
  CHECK_THAT(error_of([&] { engine::load_npy(junk); }), Contains("junk.npy: not a .npy file"));

  engine::save_npy(dir / "ok.npy", Tensor::from_vector<float>({1, 2, 3, 4}, {4}));
  const std::string good = read_all(dir / "ok.npy");
  const std::string cut = dir.write("cut.npy", good.substr(0, good.size() - 3));
  CHECK_THAT(error_of([&] { engine::load_npy(cut); }),
             Contains("cut.npy: data is 13 bytes, expected 16"));
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  CHECK_THAT(error_of([&] { engine::load_npy(dir.write("f.npy", fortran)); }),
             Contains("expected 'fortran_order': False"));
  std::string big_endian = good;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  CHECK_THAT(error_of([&] { engine::load_npy(dir.write("be.npy", big_endian)); }),
             Contains("dtype '>f4' is not supported"));
}
