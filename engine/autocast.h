// Mixed precision, autocast style. Inside an Autocast scope (per thread) the ops that do the bulk
// of the arithmetic run in a 16-bit compute dtype while the parameters stay f32 (the master copy
// the optimizer updates):
//   - matmul, linear and attention cast their f32 inputs to the compute dtype (bf16 or f16); the
//     GEMMs accumulate in f32 and store 16-bit results (attention's fused kernels read an f32
//     positional bias as it is);
//   - layer_norm runs on the compute dtype with its statistics in f32 (the kernels' rule);
//   - softmax takes a bias of another dtype in the input's dtype;
//   - cross_entropy computes in f32 with the loss in f32 (16-bit logits on a device are read as
//     they are, with the bits of casting them first; elsewhere they are cast);
//   - binary ops whose operands differ meet in the wider dtype (promote_floating); outside a
//     scope a dtype mismatch stays an error.
// Every cast is an autograd-recorded Tensor::to, so a parameter's gradient arrives in f32 in its
// f32 gradient slab. f64 tensors are never cast (gradient checks stay exact). Outside a scope
// nothing changes. The CPU kernels compute in f32 / f64 only, so a CPU op reached in a 16-bit
// dtype raises "[op] CPU kernels compute in f32 or f64, got bf16".
//
//   { engine::Autocast ac(DType::bf16); loss = model.forward(batch).loss; }  // forward only
//   loss.backward();
#pragma once

#include "engine/dtype.h"
#include "engine/tensor.h"

namespace engine {

class Autocast {
 public:
  // compute: bf16 or f16; f32 turns autocast off for the scope.
  explicit Autocast(DType compute);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DType previous_;
};

// The compute dtype of the innermost active scope on this thread; f32 when there is none.
DType autocast_dtype();
inline bool autocast_active() { return autocast_dtype() != DType::f32; }

// In a scope: an f32 / bf16 / f16 tensor converted to the compute dtype (recorded). Otherwise,
// and for undefined, f64 or integer tensors: t itself.
Tensor autocast_to_compute(const Tensor& t);
// autocast_to_compute(t) where it reads the innermost AutocastSlab's 16-bit copy (t an f32 view
// of that scope's slab: a view of the copy, recorded as the cast, no kernel once the copy exists);
// an undefined tensor otherwise (no scope, no slab, t not in it), so that a caller can keep a
// cheaper path than converting t whole.
Tensor autocast_from_slab(const Tensor& t);
// In a scope: a bf16 / f16 tensor converted to f32 (recorded). Otherwise t itself.
Tensor autocast_to_f32(const Tensor& t);

// Inside this scope (per thread), autocast's casts of f32 tensors that view `slab` (a
// FlatParameters' 1-D f32 parameter slab; any other slab: the scope does nothing) read one 16-bit
// copy of the whole slab, converted by
// one kernel at the first such cast, instead of a kernel per parameter per forward (BERT-Base: 164
// cast launches become one, about a quarter of their time on an H200 by the calibrated model,
// docs/performance-model.md). Same bits
// as the per-tensor casts; the gradients flow to the f32 parameters as through Tensor::to. The
// slab's values must not change inside the scope: engine::Trainer opens it around a step's
// forward and backward passes, before the optimizer step.
class AutocastSlab {
 public:
  explicit AutocastSlab(const Tensor& slab);
  // With the copy made already: `copy` (is_16bit_copy_of the slab) holds the
  // slab's values converted, Tensor::to's bits, and is read instead of converting them when a
  // cast asks for its dtype. The caller vouches for the values: the trainer keeps the copy its
  // optimizer writes beside the slab (train/trainer.h).
  AutocastSlab(const Tensor& slab, const Tensor& copy);
  ~AutocastSlab();
  AutocastSlab(const AutocastSlab&) = delete;
  AutocastSlab& operator=(const AutocastSlab&) = delete;

  // t cast to `dtype` through the slab's copy, or an undefined tensor when t is not a view of
  // the slab (autocast_to_compute then casts it alone).
  Tensor cast(const Tensor& t, DType dtype);
  // The 16-bit copy the casts read (given or converted by the first cast), or undefined when
  // none was made.
  const Tensor& copy() const { return half_; }

 private:
  Tensor slab_, half_;
  AutocastSlab* previous_;
};

// Whether `copy` can hold `slab`'s values in 16 bits for AutocastSlab and the optimizers' update
// (Optimizer::step_on_device): bf16 or f16, contiguous, the slab's numel, on its device.
bool is_16bit_copy_of(const Tensor& copy, const Tensor& slab);

// t.to(converted.dtype()) when the converted values exist already (a view into a converted copy
// of t's storage, as AutocastSlab keeps): a fresh handle on `converted`'s values, recorded as
// Tensor::to records the cast, so the gradient flows back to t. Same shape and device, another
// floating dtype; the caller vouches for the values.
Tensor cast_precomputed(const Tensor& t, const Tensor& converted);

// "f32" | "bf16" | "fp16" (a config's train.precision) -> f32, bf16, f16; other text throws.
DType precision_dtype(const std::string& precision);

}  // namespace engine
