// [cuda] safetensors with device tensors: saving gathers CUDA tensors (strided views too) to the
// host; load_safetensors_into copies into CUDA parameters in place.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "engine/safetensors.h"
#include "ops/ops.h"

using namespace engine;

TEST_CASE("safetensors saves CUDA tensors and loads into CUDA parameters", "[cuda]") {
  const Device gpu = Device::cuda(0);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("engine_safetensors_cuda_" + std::to_string(::getpid()) + ".st"))
                               .string();
  Generator g(21);
  Tensor w = Tensor::randn({4, 3}, g);
  Tensor b = Tensor::randn({5}, g).to(DType::bf16);
  save_safetensors(path, {{"w", w.to(gpu)}, {"wt", w.to(gpu).transpose(0, 1)}, {"b", b.to(gpu)}});

  SafetensorsContents c = load_safetensors(path);
  REQUIRE(c.tensors.size() == 3);
  REQUIRE(c.tensors[0].second.to_vector<float>() == w.to_vector<float>());
  REQUIRE(c.tensors[1].second.shape() == Shape{3, 4});
  REQUIRE(c.tensors[1].second.to_vector<float>() ==
          w.transpose(0, 1).contiguous().to_vector<float>());
  REQUIRE(c.tensors[2].second.dtype() == DType::bf16);
  REQUIRE(c.tensors[2].second.to_vector<float>() == b.to_vector<float>());

  Tensor dw = Tensor::zeros({4, 3}, DType::f32, gpu);
  dw.set_requires_grad(true);
  Tensor db = Tensor::zeros({5}, DType::bf16, gpu);
  load_safetensors_into(path, {{"w", dw}, {"b", db}}, engine::ExtraTensors::read);
  REQUIRE(dw.device() == gpu);
  REQUIRE(dw.requires_grad());
  REQUIRE(dw.to_vector<float>() == w.to_vector<float>());
  REQUIRE(db.to_vector<float>() == b.to_vector<float>());
  std::filesystem::remove(path);
}
