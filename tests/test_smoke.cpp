#include <catch2/catch.hpp>

#include "ops/ops.h"
using namespace engine;
TEST_CASE("smoke: add forward", "[ops]") {
  Tensor a = Tensor::from_vector<float>({1, 2, 3}, {3});
  Tensor b = Tensor::from_vector<float>({10}, {1});
  REQUIRE((a + b).to_vector<float>() == std::vector<float>{11, 12, 13});
}
