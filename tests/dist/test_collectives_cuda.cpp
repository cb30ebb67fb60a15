// [dist] The NCCL path for CUDA tensors under `mpirun -np 2` (in the emulation build: the NCCL
// shim over MPI, emu/nccl.cpp): all-reduce and broadcast of device tensors equal the MPI path's
// results on the same values, and the bucketed gradient reducer on a CUDA parameter slab gives
// the CPU run's gradients.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "engine/comm.h"
#include "engine/data_parallel.h"
#include "engine/module.h"
#include "engine/rng.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

using engine::Device;
using engine::DType;
using engine::ReduceOp;
using engine::Tensor;

namespace {

const Device kGpu = Device::cuda(0);
engine::Communicator& comm() { return engine::world(); }

engine::NamedTensors make_params(uint64_t seed, Device device) {
  engine::Generator gen(seed);
  engine::NamedTensors p;
  for (auto [name, shape] : std::vector<std::pair<const char*, engine::Shape>>{
           {"w1", {16, 8}}, {"b1", {16}}, {"w2", {4, 16}}, {"b2", {4}}}) {
    Tensor t = Tensor::randn(shape, gen, 0.0, 0.3).to(device);
    t.set_requires_grad(true);
    p.emplace_back(name, t);
  }
  return p;
}

// A two-layer network's backward from a fixed output gradient (no reduction op needed).
void backward_of(const engine::NamedTensors& p, int rank, int micro, Device device) {
  engine::Generator gen(1000 + 10 * uint64_t(rank) + uint64_t(micro));
  Tensor x = Tensor::randn({5, 8}, gen).to(device);
  Tensor dy = Tensor::randn({5, 4}, gen).to(device);
  Tensor h = engine::tanh(engine::linear(x, p[0].second, p[1].second));
  engine::linear(h, p[2].second, p[3].second).backward(dy);
}

}  // namespace

TEST_CASE("CUDA tensors go through NCCL", "[dist]") { CHECK(comm().backend(kGpu) == "mpi+nccl"); }

TEST_CASE("NCCL all_reduce of CUDA tensors equals the MPI path", "[dist]") {
  const int r = comm().rank(), n = comm().size();
  engine::Generator gen(50 + uint64_t(r));
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    for (DType dt : {DType::f32, DType::f64}) {
      INFO("op " << static_cast<int>(op) << " " << engine::dtype_name(dt));
      Tensor h = Tensor::randn({1031}, gen, 0, 1, dt);
      Tensor d = h.to(kGpu);
      comm().all_reduce(h, op);  // MPI
      comm().all_reduce(d, op);  // NCCL
      CHECK(d.to(Device::cpu()).to_vector<double>() == h.to_vector<double>());
    }
  }
  // bf16 (which the MPI path refuses): reduced in f32, rounded once.
  std::vector<float> mine(257), sum(257, 0.f);
  for (int k = 0; k < n; ++k)
    for (size_t i = 0; i < mine.size(); ++i) {
      const float v = static_cast<float>(k + 1) * 0.125f * static_cast<float>(i % 7);
      if (k == r) mine[i] = v;
      sum[i] += v;
    }
  Tensor b = Tensor::from_vector(mine, {257}).to(DType::bf16).to(kGpu);
  comm().all_reduce(b, ReduceOp::sum);
  CHECK(b.to(Device::cpu()).to(DType::f32).to_vector<float>() ==
        Tensor::from_vector(sum, {257}).to(DType::bf16).to(DType::f32).to_vector<float>());
  // Refused with the engine's message.
  Tensor wide = Tensor::zeros({4, 4}, DType::f32, kGpu);
  CHECK_THROWS_WITH(comm().all_reduce(wide.transpose(0, 1)), Catch::Contains("contiguous"));
  comm().barrier();
}

TEST_CASE("NCCL broadcast of CUDA tensors from any root", "[dist]") {
  const int r = comm().rank(), n = comm().size();
  for (int root = 0; root < n; ++root) {
    Tensor t = Tensor::from_vector<float>({float(r), float(r * 2), 0.5f}, {3}).to(kGpu);
    comm().broadcast(t, root);
    CHECK(t.to(Device::cpu()).to_vector<float>() ==
          std::vector<float>{float(root), float(root * 2), 0.5f});
  }
}

TEST_CASE("GradReducer on a CUDA slab gives the CPU run's gradients", "[dist]") {
  const int r = comm().rank();
  std::vector<float> grads[2];
  int early[2] = {0, 0};
  for (int dev = 0; dev < 2; ++dev) {
    const Device device = dev == 0 ? Device::cpu() : kGpu;
    engine::NamedTensors p = make_params(7, device);
    engine::FlatParameters flat(p);
    engine::GradReducer reducer(flat, comm(), 16 * 4);  // several buckets, started in backward
    flat.zero_grad();
    backward_of(p, r, 0, device);  // accumulated locally
    reducer.begin();
    backward_of(p, r, 1, device);  // reduced
    reducer.finish();
    early[dev] = static_cast<int>(reducer.last_started_early());
    grads[dev] = flat.grad().to(Device::cpu()).to_vector<float>();
  }
  REQUIRE(grads[0].size() == grads[1].size());
  double worst = 0, scale = 0;
  for (size_t k = 0; k < grads[0].size(); ++k) {
    worst = std::max(worst, double(std::abs(grads[0][k] - grads[1][k])));
    scale = std::max(scale, double(std::abs(grads[0][k])));
  }
  INFO("worst difference " << worst << " of " << scale);
  CHECK(worst <= 1e-5 * scale);
  CHECK(early[1] >= 2);  // buckets started while backward ran, on the device too
  CHECK(early[1] == early[0]);
}

TEST_CASE("GradReducer in bf16 on a CUDA slab (NCCL bf16) equals the CPU (MPI) run bit for bit",
          "[dist]") {
  // Two ranks: each element is rounded to bf16, summed once and rounded once, by NCCL's bf16 sum
  // and by the MPI path's f32 sum alike.
  const int r = comm().rank();
  std::vector<float> grads[2];
  for (int dev = 0; dev < 2; ++dev) {
    const Device device = dev == 0 ? Device::cpu() : kGpu;
    engine::NamedTensors p = make_params(7, device);
    engine::FlatParameters flat(p);
    engine::GradReducer reducer(flat, comm(), 16 * 4, engine::ReduceOp::sum, engine::DType::bf16);
    flat.zero_grad();
    reducer.begin();
    backward_of(p, r, 1, device);
    reducer.finish();
    grads[dev] = flat.grad().to(Device::cpu()).to_vector<float>();
  }
  if (comm().size() == 2) CHECK(grads[1] == grads[0]);
}
