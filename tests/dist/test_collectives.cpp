// Collectives and the gradient reducer across the ranks of `mpirun -np 2` (any size works).
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/comm.h"
#include "engine/data_parallel.h"
#include "engine/module.h"
#include "engine/rng.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

using engine::DType;
using engine::ReduceOp;
using engine::Tensor;

namespace {

engine::Communicator& comm() { return engine::world(); }

// A two-layer model's parameters (the last ones registered produce gradients first).
engine::NamedTensors make_params(uint64_t seed) {
  engine::Generator gen(seed);
  engine::NamedTensors p;
  for (auto [name, shape] : std::vector<std::pair<const char*, engine::Shape>>{
           {"w1", {16, 8}}, {"b1", {16}}, {"w2", {4, 16}}, {"b2", {4}}}) {
    Tensor t = Tensor::randn(shape, gen, 0.0, 0.3);
    t.set_requires_grad(true);
    p.emplace_back(name, t);
  }
  return p;
}

Tensor loss_of(const engine::NamedTensors& p, const Tensor& x) {
  Tensor h = engine::tanh(engine::linear(x, p[0].second, p[1].second));
  Tensor y = engine::linear(h, p[2].second, p[3].second);
  return engine::sum(y * y);
}

Tensor rank_input(int rank, int micro) {
  engine::Generator gen(1000 + 10 * uint64_t(rank) + uint64_t(micro));
  return Tensor::randn({5, 8}, gen);
}

}  // namespace

TEST_CASE("the job has the ranks mpirun started", "[dist]") {
  REQUIRE(comm().size() >= 2);
  CHECK(comm().rank() < comm().size());
  CHECK(comm().local_rank() < comm().local_size());
  CHECK(comm().backend(engine::Device::cpu()) == "mpi");
  CHECK(engine::launched_by_mpi());
}

TEST_CASE("all_reduce: sum, avg, max, min over f32, f64 and i64", "[dist]") {
  const int r = comm().rank(), n = comm().size();
  double rank_sum = 0;
  for (int k = 0; k < n; ++k) rank_sum += k;
  Tensor f = Tensor::from_vector<float>({float(r), 1.5f, -float(r)}, {3});
  comm().all_reduce(f, ReduceOp::sum);
  CHECK(f.to_vector<float>() ==
        std::vector<float>{float(rank_sum), 1.5f * float(n), -float(rank_sum)});
  Tensor d = Tensor::from_vector<double>({double(r), 2.0}, {2});
  comm().all_reduce(d, ReduceOp::avg);
  CHECK(d.to_vector<double>()[0] == Approx(rank_sum / n));
  CHECK(d.to_vector<double>()[1] == 2.0);
  Tensor i = Tensor::from_vector<int64_t>({int64_t(r), -int64_t(r)}, {2});
  comm().all_reduce(i, ReduceOp::max);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{n - 1, 0});
  Tensor m = Tensor::from_vector<int64_t>({int64_t(r)}, {1});
  comm().all_reduce(m, ReduceOp::min);
  CHECK(m.to_vector<int64_t>()[0] == 0);
  CHECK(comm().all_reduce(double(r + 1)) == Approx(rank_sum + n));
  // Non-contiguous tensors and unsupported dtypes are refused with a message.
  Tensor wide = Tensor::zeros({4, 4});
  CHECK_THROWS_WITH(comm().all_reduce(wide.transpose(0, 1)), Catch::Contains("contiguous"));
  CHECK_THROWS_WITH(comm().all_reduce(Tensor::zeros({2}, DType::f16)), Catch::Contains("f16"));
  CHECK_THROWS_WITH(comm().all_reduce(Tensor::zeros({2}, DType::bf16), ReduceOp::avg),
                    Catch::Contains("avg of a bf16 CPU tensor"));
  // bf16 sums in f32 and rounds once: 1 + 2^-1 + 2^-7 (a bf16 value) on each of 2 ranks sums to
  // a bf16 value exactly; 1 + 2^-7 + 2^-9 rounds to bf16 first.
  Tensor h = Tensor::full({3}, 1.5078125, DType::bf16);
  comm().all_reduce(h);
  if (n == 2) CHECK(h.to(DType::f64).to_vector<double>()[2] == 3.015625);
  comm().barrier();
}

TEST_CASE("broadcast: tensors and text from any root", "[dist]") {
  const int r = comm().rank(), n = comm().size();
  for (int root = 0; root < n; ++root) {
    Tensor t = Tensor::from_vector<float>({float(r), float(r * 2)}, {2});
    comm().broadcast(t, root);
    CHECK(t.to_vector<float>() == std::vector<float>{float(root), float(root * 2)});
    const std::string text =
        comm().broadcast(r == root ? std::string(1000 + root, 'x') + "end" : "", root);
    CHECK(text == std::string(1000 + root, 'x') + "end");
  }
  CHECK_THROWS_WITH(comm().broadcast(Tensor::zeros({1}), n),
                    Catch::Contains("broadcast from rank"));
}

TEST_CASE("GradReducer: bucketed sums equal the all-reduced gradients, started during backward",
          "[dist]") {
  const int r = comm().rank();
  // The same initial parameters on every rank (as after broadcast_parameters).
  engine::NamedTensors p = make_params(7);
  engine::FlatParameters flat(p);
  // Tiny buckets: one per parameter or so, so several start while backward runs.
  engine::GradReducer reducer(flat, comm(), 16 * 4);
  REQUIRE(reducer.num_buckets() == 4);

  // Expected: this rank's gradients of two micro-batches, summed over the ranks in one piece.
  flat.zero_grad();
  for (int micro = 0; micro < 2; ++micro) loss_of(p, rank_input(r, micro)).backward();
  Tensor expected = flat.grad().clone();
  comm().all_reduce(expected, ReduceOp::sum);

  // Accumulation: the first micro-batch stays local, the last one reduces.
  flat.zero_grad();
  loss_of(p, rank_input(r, 0)).backward();
  reducer.begin();
  loss_of(p, rank_input(r, 1)).backward();
  reducer.finish();
  CHECK(reducer.last_started_early() >= 2);
  const std::vector<float> got = flat.grad().to_vector<float>(), want = expected.to_vector<float>();
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t k = 0; k < got.size(); ++k)
    worst = std::max(worst, double(std::abs(got[k] - want[k])));
  CHECK(worst <= 1e-6);

  // Without begin(), finish() reduces the whole slab.
  flat.zero_grad();
  loss_of(p, rank_input(r, 0)).backward();
  loss_of(p, rank_input(r, 1)).backward();
  reducer.finish();
  CHECK(flat.grad().to_vector<float>() == got);
}

TEST_CASE("GradReducer in bf16: each bucket rounded, summed in f32, rounded once, f32 slab",
          "[dist]") {
  const int r = comm().rank();
  engine::NamedTensors p = make_params(7);
  engine::FlatParameters flat(p);
  engine::GradReducer reducer(flat, comm(), 16 * 4, ReduceOp::sum, DType::bf16);
  // Expected: the bf16 roundings of every rank's gradient, summed in f32, rounded to bf16.
  flat.zero_grad();
  loss_of(p, rank_input(r, 0)).backward();
  const Tensor local = flat.grad().clone();
  Tensor expected = local.to(DType::bf16).to(DType::f32);
  comm().all_reduce(expected, ReduceOp::sum);
  expected = expected.to(DType::bf16).to(DType::f32);
  Tensor exact = local.clone();
  comm().all_reduce(exact, ReduceOp::sum);

  flat.zero_grad();
  reducer.begin();
  loss_of(p, rank_input(r, 0)).backward();
  reducer.finish();
  CHECK(reducer.last_started_early() >= 2);
  REQUIRE(flat.grad().dtype() == DType::f32);
  CHECK(flat.grad().to_vector<float>() == expected.to_vector<float>());
  CHECK(flat.grad().to_vector<float>() != exact.to_vector<float>());  // it did round
  REQUIRE_THROWS_WITH(engine::GradReducer(flat, comm(), 64, ReduceOp::avg, DType::bf16),
                      Catch::Contains("[ddp] a bf16 gradient all-reduce sums (ReduceOp::sum)"));
  REQUIRE_THROWS_WITH(engine::GradReducer(flat, comm(), 64, ReduceOp::sum, DType::f16),
                      Catch::Contains("reduce in their own dtype or, from f32, in bf16; got f16"));
}

TEST_CASE("a NaN gradient on one rank is seen by every rank", "[dist]") {
  engine::NamedTensors p = make_params(11);
  engine::FlatParameters flat(p);
  engine::GradReducer reducer(flat, comm());
  flat.zero_grad();
  reducer.begin();
  Tensor x = rank_input(comm().rank(), 0);
  if (comm().rank() == 1)
    x = x * Tensor::from_vector<float>({std::numeric_limits<float>::quiet_NaN()}, {1});
  loss_of(p, x).backward();
  reducer.finish();
  const std::vector<float> g = flat.grad().to_vector<float>();
  const int64_t off = flat.entries()[0].offset;  // w1: every element depends on x
  CHECK(std::isnan(g[size_t(off)]));
}

TEST_CASE("broadcast_parameters copies rank 0's values", "[dist]") {
  engine::NamedTensors p = make_params(100 + uint64_t(comm().rank()));
  engine::FlatParameters flat(p);
  engine::broadcast_parameters(flat, comm());
  engine::NamedTensors p0 = make_params(100);
  for (size_t k = 0; k < p.size(); ++k)
    CHECK(p[k].second.to_vector<float>() == p0[k].second.to_vector<float>());
}
