// Categorical sampling and token replacement: argument checks and the CPU kernels.
#include "ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/cpu/parallel.h"
#include "engine/cpu/philox.h"
#include "engine/dispatch.h"
#include "engine/error.h"

namespace engine {
namespace {

namespace cpu {

void sample_categorical(const Tensor& logits, double temperature, PhiloxState s,
                        const Tensor& out) {
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  const float t = static_cast<float>(temperature);
  int64_t* o = out.data<int64_t>();
  // Rows in chunks of kRows: the chunk's scores (its words drawn 64 at a time, across row ends),
  // then each row's argmax. kRows x C words is a whole number of Philox blocks, so a chunk's
  // words start at block offset + i0 * C / 4; the buffer stays kRows x C.
  constexpr int64_t kRows = 64;
  check_host_state(s, "sample_categorical");
  std::vector<float> score(static_cast<size_t>(std::min(n, kRows) * c));
  dispatch_floating(logits.dtype(), "sample_categorical", [&]<class T>() {
    for (int64_t i0 = 0; i0 < n; i0 += kRows) {
      const int64_t rows = std::min(kRows, n - i0);
      const T* x = logits.data<T>() + i0 * c;
      const PhiloxState chunk{s.seed, s.offset + static_cast<uint64_t>(i0 * c / 4)};
      engine::cpu::philox::for_each_words(
          rows * c, chunk, [&](int64_t base, const uint32_t* words, int64_t count) {
            // Locals (dropout.cpp says why): a store to score must not look like it aliases t.
            const float tl = t;
            const T* xb = x + base;
            float* sb = score.data() + base;
            for (int64_t k = 0; k < count; ++k)
              sb[k] = static_cast<float>(xb[k]) / tl + gumbel_from_word(words[k]);
          });
#pragma omp parallel for if (rows * c > ::engine::cpu::kParallelMinElems)
      for (int64_t i = 0; i < rows; ++i) {
        const float* r = score.data() + i * c;
        float best = -std::numeric_limits<float>::infinity();
        int64_t arg = 0;
        for (int64_t j = 0; j < c; ++j)
          if (r[j] > best) best = r[j], arg = j;
        o[i0 + i] = arg;
      }
    }
  });
}

void replace_tokens(const Tensor& ids, const Tensor& mask, const Tensor& positions,
                    const Tensor& values, const Tensor& original, const Tensor& out_ids,
                    const Tensor& out_labels) {
  const int64_t n = ids.numel(), m = positions.numel();
  const int64_t* in = ids.data<int64_t>();
  const int64_t* am = mask.defined() ? mask.data<int64_t>() : nullptr;
  int64_t* oi = out_ids.data<int64_t>();
  int64_t* ol = out_labels.data<int64_t>();
  for (int64_t e = 0; e < n; ++e) {
    oi[e] = in[e];
    ol[e] = am && am[e] == 0 ? -100 : 0;
  }
  const int64_t* p = positions.data<int64_t>();
  const int64_t* v = values.data<int64_t>();
  const int64_t* orig = original.data<int64_t>();
  for (int64_t k = 0; k < m; ++k) {
    oi[p[k]] = v[k];
    ol[p[k]] = v[k] != orig[k];
  }
}

}  // namespace cpu

ENGINE_REGISTER_KERNEL(sample_categorical_kernel, DeviceType::CPU, cpu::sample_categorical);
ENGINE_REGISTER_KERNEL(replace_tokens_kernel, DeviceType::CPU, cpu::replace_tokens);

void check_i64(const Tensor& t, const char* what, int dims) {
  ENGINE_CHECK(t.defined() && t.dtype() == DType::i64 && t.dim() == dims, "[replace_tokens] ", what,
               " must be a ", dims, "-d i64 tensor, got ",
               t.defined() ? describe(t) : std::string("none"));
}

}  // namespace

Tensor sample_categorical(const Tensor& logits, double temperature, Generator& gen) {
  ENGINE_CHECK(logits.defined() && logits.dim() == 2 && is_floating(logits.dtype()),
               "[sample_categorical] logits must be (N, C) floating, got ",
               logits.defined() ? describe(logits) : std::string("none"));
  ENGINE_CHECK(logits.size(1) >= 1, "[sample_categorical] no class to draw: ", describe(logits));
  ENGINE_CHECK(temperature > 0 && std::isfinite(temperature),
               "[sample_categorical] temperature must be positive and finite, got ", temperature);
  const Tensor x = logits.detach().contiguous();
  const PhiloxState s = gen.reserve_words(static_cast<uint64_t>(x.numel()));
  Tensor out = Tensor::empty({x.size(0)}, DType::i64, x.device());
  if (x.size(0) > 0) sample_categorical_kernel(x.device(), x, temperature, s, out);
  return out;
}

ReplacedTokens replace_tokens(const Tensor& ids, const Tensor& attention_mask,
                              const Tensor& positions, const Tensor& values,
                              const Tensor& original) {
  check_i64(ids, "input_ids", 2);
  check_i64(positions, "positions", 1);
  check_i64(values, "values", 1);
  check_i64(original, "original", 1);
  ENGINE_CHECK(values.shape() == positions.shape() && original.shape() == positions.shape(),
               "[replace_tokens] positions ", describe(positions), ", values ", describe(values),
               " and original ", describe(original), " must have one shape");
  if (attention_mask.defined()) {
    check_i64(attention_mask, "attention_mask", 2);
    ENGINE_CHECK(attention_mask.shape() == ids.shape(), "[replace_tokens] attention_mask ",
                 describe(attention_mask), " does not match input_ids ", describe(ids));
  }
  const Device dev = ids.device();
  for (const Tensor* t : {&positions, &values, &original, &attention_mask})
    ENGINE_CHECK(!t->defined() || t->device() == dev, "[replace_tokens] ", describe(*t),
                 " is not on input_ids' device ", describe(ids));
  const Tensor p = positions.contiguous();
  if (dev.is_cpu()) {
    // Host-side range check for CPU tensors (a device kernel traps instead).
    const int64_t* pp = p.data<int64_t>();
    for (int64_t k = 0; k < p.numel(); ++k)
      ENGINE_CHECK(pp[k] >= 0 && pp[k] < ids.numel(), "[replace_tokens] position ", pp[k], " at ",
                   k, " is outside the ", describe(ids), " input (expected 0 <= p < ", ids.numel(),
                   ")");
  }
  ReplacedTokens r;
  r.ids = Tensor::empty(ids.shape(), DType::i64, dev);
  r.labels = Tensor::empty(ids.shape(), DType::i64, dev);
  replace_tokens_kernel(dev, ids.contiguous(),
                        attention_mask.defined() ? attention_mask.contiguous() : Tensor(), p,
                        values.contiguous(), original.contiguous(), r.ids, r.labels);
  return r;
}

}  // namespace engine
