// [cuda] the LAMB step on the device against the CPU backend, bit for bit: its three kernels
// (moments and per-chunk sums, per-tensor ratios, the update) are specified to add in the order the
// CPU kernel follows (engine/optim.h), so the parameters and moments must be equal after host
// steps, clipped and skipped device-controlled steps, with the trust ratio on decayed tensors or on
// all. Awkward shapes: tensors of 1 and 5 elements, one not a multiple of 4 crossing chunks, one of
// 0s.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "engine/optim.h"
#include "ops/ops.h"

using namespace engine;
using engine::testing::kGpu;
using engine::testing::require_equal;

namespace {

NamedTensors lamb_params(uint64_t seed) {
  Generator g(seed);
  return {{"emb.weight", Tensor::randn({2 * 4096 + 1027}, g, 0, 0.5).set_requires_grad()},
          {"layer.bias", Tensor::randn({5}, g, 0, 0.5).set_requires_grad()},
          {"layer.norm.weight", Tensor::randn({1}, g, 1, 0.1).set_requires_grad()},
          {"zero.weight", Tensor::zeros({300}).set_requires_grad()},
          {"head.weight", Tensor::randn({7, 9}, g, 0, 0.5).set_requires_grad()}};
}

bool decays(const std::string& name) { return !default_no_decay(name); }

}  // namespace

TEST_CASE("the LAMB step on the device equals the CPU step bit for bit", "[cuda]") {
  for (const bool all : {false, true}) {
    INFO("trust_ratio_all " << all);
    NamedTensors pc = lamb_params(3), pg = lamb_params(3);
    FlatParameters fc(pc), fg(pg, kGpu);
    OptimizerOptions opt;
    opt.weight_decay = 0.05;
    opt.trust_ratio_all = all;
    Lamb cpu(fc, opt, decays), gpu(fg, opt, decays);
    Generator g(9);
    for (int step = 1; step <= 3; ++step) {
      const Tensor grad = scale(Tensor::randn({fc.numel()}, g), 0.1 * step);
      fc.grad().copy_(grad);
      fg.grad().copy_(grad.to(kGpu));
      const double lr = 2e-3 * step, coef = step == 2 ? 0.37 : 1.0;
      cpu.step(lr, coef);
      gpu.step(lr, coef);
      require_equal(fg.data(), fc.data());
    }
    // The device controls of a graph's step (Optimizer::step_on_device): clipped, then skipped.
    for (const double nonfinite : {0.0, 1.0}) {
      const std::array<double, 3> next = cpu.next_step_scalars(5e-3);
      const std::vector<double> c = {next[0], next[1], next[2], 4.0, nonfinite};  // norm 2
      cpu.step_on_device(Tensor::from_vector(c, {5}), 0.5);
      gpu.step_on_device(Tensor::from_vector(c, {5}).to(kGpu), 0.5);
      if (nonfinite == 0) {
        cpu.count_step();
        gpu.count_step();
      }
    }
    require_equal(fg.data(), fc.data());
    require_equal(gpu.state()[0].second, cpu.state()[0].second);
    require_equal(gpu.state()[1].second, cpu.state()[1].second);
  }
}

TEST_CASE(
    "AdamW and LAMB on the device write the parameters' 16-bit copy with the CPU's bits, a "
    "skipped step none",
    "[cuda]") {
  // The copy autocast's casts read (AdamWStepScalars::copy): written by the update's own pass
  // (8-byte stores of 4 elements, the tails one by one); equal to the CPU's and to Tensor::to.
  for (const char* name : {"adamw", "lamb"})
    for (const DType dt : {DType::bf16, DType::f16}) {
      INFO(name << " " << dtype_name(dt));
      NamedTensors pc = lamb_params(5), pg = lamb_params(5);
      FlatParameters fc(pc), fg(pg, kGpu);
      OptimizerOptions opt;
      opt.name = name;
      opt.weight_decay = 0.05;
      std::unique_ptr<Optimizer> cpu = make_optimizer(fc, opt, decays),
                                 gpu = make_optimizer(fg, opt, decays);
      const Tensor cc = fc.data().to(dt), cg = fg.data().to(dt);
      Generator g(13);
      for (int step = 1; step <= 3; ++step) {
        INFO("step " << step);
        const Tensor grad = scale(Tensor::randn({fc.numel()}, g), 0.1 * step);
        fc.grad().copy_(grad);
        fg.grad().copy_(grad.to(kGpu));
        const std::array<double, 3> next = cpu->next_step_scalars(2e-3 * step);
        const double nonfinite = step == 2 ? 1.0 : 0.0;
        const std::vector<double> c = {next[0], next[1], next[2], 4.0, nonfinite};
        const Tensor before = cg.clone();
        cpu->step_on_device(Tensor::from_vector(c, {5}), 0.5, cc);
        gpu->step_on_device(Tensor::from_vector(c, {5}).to(kGpu), 0.5, cg);
        require_equal(fg.data(), fc.data());
        require_equal(cg, cc);
        if (nonfinite > 0) {
          require_equal(cg, before);
        } else {
          cpu->count_step();
          gpu->count_step();
          require_equal(cg, fg.data().to(dt));
        }
      }
    }
}
