// The CPU backend's sum_to (every broadcast backward, sum and mean) against a single-threaded
// reference written here from the contract in engine/cpu/backend_cpu.cpp (kSumLanes): each
// output's source elements, in row-major order, are cut into chunks of 1024; in a chunk, lane j
// of 16 sums the elements whose index is j mod 16, from 0, in the accumulator type (float for
// f32/bf16/f16, double for f64 and integers); the chunk's sum is the tree lane j + lane j + 8,
// then + 4, + 2, + 1; the output is the double sum of its chunk sums, converted to the dtype.
// The results must be equal bit for bit for every shape, layout, dtype and thread count,
// because the golden tests compare model gradients bit for bit and neither the threads nor the
// loop a layout picks may change the rounding.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "ops/ops.h"

using namespace engine;

namespace {

// Values whose double sums round (magnitudes spread over 2^-20 .. 2^20; f16, whose largest value
// is 65504, over 2^-6 .. 2^6), so a different summation order would show in f64 results and often
// in f32 ones; integers for integer dtypes.
Tensor random_values(const Shape& shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  const int spread = dtype == DType::f16 ? 6 : 20;
  std::uniform_int_distribution<int> exponent(-spread, spread), small(-50, 50);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v)
    x = is_floating(dtype) ? std::ldexp(normal(rng), exponent(rng)) : double(small(rng));
  return Tensor::from_vector(v, shape).to(dtype);
}

constexpr size_t kChunk = 1024;
constexpr int kLanes = 16;

// One output's sum by the contract, from its elements in order.
template <class A>
double chunked_lane_sum(const std::vector<double>& x) {
  double total = 0.0;
  for (size_t c0 = 0; c0 < x.size(); c0 += kChunk) {
    A lane[kLanes] = {};
    for (size_t i = c0; i < std::min(x.size(), c0 + kChunk); ++i)
      lane[i % kLanes] += static_cast<A>(x[i]);
    for (int w = kLanes / 2; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
    total += static_cast<double>(lane[0]);
  }
  return total;
}

// The reference: walks src's elements in row-major order and appends each, as a double, to the
// elements of the output it broadcasts onto; sums each output's elements by the contract; then
// converts the doubles to the dtype with the same copy the engine uses for every conversion.
// `reverse` walks backwards (only to show the test can see an order change).
Tensor reference_sum_to(const Tensor& src, const Shape& to, bool reverse = false) {
  const Shape& shape = src.shape();
  const std::vector<double> x = src.to_vector<double>();  // row-major, exact for every dtype here
  const size_t lead = shape.size() - to.size();
  std::vector<std::vector<double>> elements(static_cast<size_t>(shape_numel(to)));
  std::vector<int64_t> idx(shape.size());
  const int64_t n = static_cast<int64_t>(x.size());
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = reverse ? n - 1 - k : k;
    int64_t rem = i;
    for (size_t d = shape.size(); d-- > 0;) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
    }
    int64_t j = 0;
    for (size_t d = 0; d < to.size(); ++d) j = j * to[d] + (to[d] == 1 ? 0 : idx[lead + d]);
    elements[j].push_back(x[i]);
  }
  const bool float_lanes =
      src.dtype() == DType::f32 || src.dtype() == DType::bf16 || src.dtype() == DType::f16;
  std::vector<double> acc;
  for (const auto& e : elements)
    acc.push_back(float_lanes ? chunked_lane_sum<float>(e) : chunked_lane_sum<double>(e));
  return Tensor::from_vector(acc, to).to(src.dtype());
}

Tensor engine_sum_to(const Tensor& src, const Shape& to) {
  Tensor out = Tensor::empty(to, src.dtype());
  backend_for(src).sum_to(src, out);
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.is_contiguous() &&
         b.is_contiguous() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// A source of shape `shape` in one of several layouts: contiguous, the transpose of a contiguous
// tensor (strides reversed), every other element of a larger tensor along the last dim, or
// broadcast along dim 0 (stride 0, the same values repeated).
enum class Layout { contiguous, transposed, stepped, broadcast };

Tensor make_source(const Shape& shape, DType dtype, Layout layout, uint64_t seed) {
  switch (layout) {
    case Layout::contiguous:
      return random_values(shape, dtype, seed);
    case Layout::transposed: {
      std::vector<int64_t> rev;
      Shape reversed;
      for (size_t d = shape.size(); d-- > 0;) {
        rev.push_back(static_cast<int64_t>(d));
        reversed.push_back(shape[d]);
      }
      return random_values(reversed, dtype, seed).permute(rev);
    }
    case Layout::stepped: {
      Shape wide = shape;
      wide.back() = 2 * wide.back() + 1;
      return random_values(wide, dtype, seed).slice(-1, 1, wide.back(), 2);
    }
    case Layout::broadcast: {
      Shape one = shape;
      one[0] = 1;
      return random_values(one, dtype, seed).expand(shape);
    }
  }
  return Tensor();
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous:
      return "contiguous";
    case Layout::transposed:
      return "transposed";
    case Layout::stepped:
      return "stepped";
    case Layout::broadcast:
      return "broadcast";
  }
  return "?";
}

struct Case {
  Shape from, to;
};

// Small and odd shapes, dst with size-1 dims or lacking leading dims, scalar outputs, no
// reduction at all, and shapes large enough to run on several threads (the bias gradients of
// BERT's linears, a positional bias shared by the batch or the heads).
const std::vector<Case> kCases = {
    {{1}, {}},
    {{7}, {}},
    {{7}, {1}},
    {{7, 13}, {13}},
    {{7, 13}, {7, 1}},
    {{7, 13}, {1, 1}},
    {{7, 13}, {}},
    {{7, 13}, {7, 13}},
    {{4, 6, 5}, {4, 1, 5}},
    {{4, 6, 5}, {1, 6, 1}},
    {{4, 6, 5}, {6, 5}},
    {{3, 4, 5, 6}, {4, 1, 6}},
    {{3, 1, 5, 2}, {1, 5, 1}},
    {{2, 3, 0}, {3, 1}},
    {{1031, 263}, {263}},
    {{1031, 263}, {1031, 1}},
    {{263, 1031}, {1, 1031}},
    {{1031, 263}, {1031, 263}},
    {{301, 777}, {}},
    {{12, 128, 128}, {1, 128, 128}},
    {{3, 12, 64, 65}, {1, 12, 64, 65}},
    {{3, 12, 64, 65}, {12, 1, 65}},
    {{5, 3, 7, 11, 13}, {3, 1, 11, 1}},
    {{2, 2, 40000}, {2, 1, 40000}},
    {{40000, 2, 2}, {2, 1}},
    // Many chunks, in each loop the layouts pick: a bias of few columns, of many (on AVX2 the
    // lane walk's blocks of 16, 8, 4 and 1 vectors), a width that leaves a remainder after the
    // vectors (lanes in memory), few rows (strips), a last chunk of a few rows.
    {{2500, 40}, {40}},
    {{2100, 300}, {300}},
    {{12, 100}, {100}},
    {{40, 100}, {1, 100}},
    {{3, 70, 1030}, {70, 1}},
    // One chunk of few output rows, cut into a block per thread (a small batch's bias gradient).
    {{256, 3072}, {3072}},
    {{100, 1030}, {1030}},
    {{40, 2, 700}, {2, 700}},
    // A narrow bias over a chunk of 1024 rows and one of 530 (AVX2: the lane walk one vector at
    // a time).
    {{1554, 24}, {24}},
};

// One case: the engine at each thread count against the reference, bit for bit.
void check_case(const Case& c, DType dtype, Layout layout, const std::vector<int>& threads,
                uint64_t seed) {
  if (layout != Layout::contiguous && c.from.empty()) return;
  Tensor src = make_source(c.from, dtype, layout, seed);
  const Tensor want = reference_sum_to(src, c.to);
  for (int t : threads) {
    omp_set_num_threads(t);
    const Tensor got = engine_sum_to(src, c.to);
    INFO(shape_str(c.from) << " -> " << shape_str(c.to) << " " << dtype_name(dtype) << " "
                           << layout_name(layout) << " strides " << shape_str(src.strides()) << ", "
                           << t << " threads");
    CHECK(same_bits(got, want));
  }
}

}  // namespace

// 3 and 7 threads split dims unevenly (more threads than cores is fine for a test). Under
// AddressSanitizer (tools/asan_test.sh, which looks for bad accesses, not for bits: the Release
// suite has all four) one thread and the most uneven split, 7 (it was the 47-s case there).
#if defined(__SANITIZE_ADDRESS__)
const std::vector<int> kThreadCounts = {1, 7};
#else
const std::vector<int> kThreadCounts = {1, 2, 3, 7};
#endif

TEST_CASE("sum_to equals the chunked-lanes reference bit for bit", "[sum_to]") {
  const int max_threads = omp_get_max_threads();
  uint64_t seed = 1;
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    for (const Case& c : kCases) {
      for (Layout layout :
           {Layout::contiguous, Layout::transposed, Layout::stepped, Layout::broadcast}) {
        check_case(c, dtype, layout, kThreadCounts, seed++);
      }
    }
  }
  omp_set_num_threads(max_threads);
}

TEST_CASE("sum_to of BERT-Base bias gradients equals the reference bit for bit", "[sum_to]") {
  const int max_threads = omp_get_max_threads();
  for (DType dtype : {DType::f32, DType::bf16}) {
    check_case({{32 * 128, 768}, {768}}, dtype, Layout::contiguous, {1, 2, 4}, 11);
    check_case({{32 * 128, 768}, {768}}, dtype, Layout::transposed, {1, 2, 4}, 12);
  }
  // A large bias gradient: many chunks of whole rows, lanes in memory, on several threads.
  check_case({{16384, 1040}, {1040}}, DType::f32, Layout::contiguous, {1, 2}, 13);
  omp_set_num_threads(max_threads);
}

TEST_CASE("sum_to's reference sees a change of summation order", "[sum_to]") {
  // Guards the test above: with these values a sum in another order differs in f64, so equal
  // bits there mean the same order, not just a forgiving comparison.
  Tensor src = random_values({1031, 263}, DType::f64, 5);
  CHECK_FALSE(same_bits(reference_sum_to(src, {263}), reference_sum_to(src, {263}, true)));
}

TEST_CASE("sum_to via sum and mean keeps the reference's bits", "[sum_to]") {
  Tensor x = random_values({64, 300, 7}, DType::f32, 9);
  CHECK(same_bits(sum(x, {0, 2}), reference_sum_to(x, {1, 300, 1}).view({300})));
  CHECK(same_bits(sum(x), reference_sum_to(x, {})));
}
