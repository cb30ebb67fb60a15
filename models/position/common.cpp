// Shared helpers of the positional families (common.h) and the length-constant cache
// (component.h).
#include "models/position/common.h"

#include <cmath>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/ops.h"

namespace models {

namespace position {

Tensor sinusoid(const Tensor& positions, const Tensor& freqs) {
  // Always f32, also under mixed precision: a bf16 angle of position 300 is off by a whole radian.
  engine::Autocast f32(engine::DType::f32);
  Tensor angles = engine::matmul(positions.unsqueeze(1), freqs.unsqueeze(0));  // (N, K)
  Tensor pair =
      engine::concat({engine::sin(angles).unsqueeze(2), engine::cos(angles).unsqueeze(2)}, 2);
  return pair.reshape({positions.size(0), 2 * freqs.size(0)});
}

Tensor sinusoid_freqs(int64_t width) {
  std::vector<float> w(static_cast<size_t>(width / 2));
  for (int64_t k = 0; k < width / 2; ++k)
    w[size_t(k)] = static_cast<float>(std::pow(10000.0, -2.0 * double(k) / double(width)));
  return Tensor::from_vector<float>(w, {width / 2});
}

Tensor range_f32(int64_t start, int64_t end, engine::Device device) {
  std::vector<float> v;
  for (int64_t i = start; i < end; ++i) v.push_back(float(i));
  return Tensor::from_vector<float>(v, {end - start}).to(device);
}

Tensor heads_of(const Tensor& x, int64_t h) {
  const int64_t n = x.size(0);
  return x.view({n, h, x.size(1) / h}).permute({1, 0, 2});
}

Tensor cpu_f32(const Tensor& x) { return x.to(engine::Device::cpu()).contiguous(); }

CorrelationMatrix ape_dot(const Tensor& positions, const CorrelationContext& ctx) {
  const Tensor pe = cpu_f32(positions);
  CorrelationMatrix dot;
  dot.name = "ape_dot";
  dot.title = ctx.prefix + "P P^T between absolute position vectors";
  dot.description = "p_i . p_j of the input position vectors (before the input LayerNorm)";
  dot.values = engine::matmul(pe, pe.transpose(0, 1)).unsqueeze(0);
  dot.per_head = false;
  return dot;
}

}  // namespace position

// ---- LengthConstants
// -----------------------------------------------------------------------------

int LengthConstants::add(int lead_dims, Build build) {
  ENGINE_CHECK(longest_.length == 0, "[position] constants added after the first build");
  slots_.push_back(Slot{lead_dims, std::move(build), -1, {}});
  return int(slots_.size()) - 1;
}

int LengthConstants::add_derived(int source, Derive derive) {
  ENGINE_CHECK(source >= 0 && source < int(slots_.size()), "[position] no constant slot ", source);
  slots_.push_back(Slot{0, {}, source, std::move(derive)});
  return int(slots_.size()) - 1;
}

const Tensor& LengthConstants::get(int slot, int64_t t, engine::Device dev) const {
  return at(t, dev).values.at(size_t(slot));
}

const LengthConstants::Set& LengthConstants::at(int64_t t, engine::Device dev) const {
  engine::NoGrad ng;
  if (longest_.device != dev) longest_ = recent_ = Set{};
  if (longest_.length < t) {
    // Built in f32 whatever the compute dtype.
    engine::Autocast f32(engine::DType::f32);
    ++builds_;
    Set s;
    s.length = t;
    s.device = dev;
    for (const Slot& slot : slots_)
      s.values.push_back(slot.build ? slot.build(t, dev)
                                    : slot.derive(s.values[size_t(slot.source)]));
    longest_ = std::move(s);
  }
  if (t == longest_.length) return longest_;
  if (recent_.length != t || recent_.device != dev) {
    // The leading block of the longest length's tensors, copied on the device.
    Set s;
    s.length = t;
    s.device = dev;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& slot = slots_[i];
      if (!slot.build) {
        s.values.push_back(slot.derive(s.values[size_t(slot.source)]));
        continue;
      }
      Tensor y = longest_.values[i];
      if (y.defined() && slot.lead_dims > 0) {
        y = y.slice(0, 0, t);
        if (slot.lead_dims == 2) y = y.slice(1, 0, t);
        y = y.contiguous();
      }
      s.values.push_back(y);
    }
    recent_ = std::move(s);
  }
  return recent_;
}

}  // namespace models
