// The per-thread autocast scope (see autocast.h).
#include "engine/autocast.h"

#include "engine/error.h"

namespace engine {
namespace {
thread_local DType t_compute = DType::f32;
thread_local AutocastSlab* t_slab = nullptr;  // the innermost AutocastSlab scope
}  // namespace

Autocast::Autocast(DType compute) : previous_(t_compute) {
  ENGINE_CHECK(compute == DType::f32 || compute == DType::bf16 || compute == DType::f16,
               "[autocast] the compute dtype must be bf16, f16 or f32 (off), got ",
               dtype_name(compute));
  t_compute = compute;
}

Autocast::~Autocast() { t_compute = previous_; }

DType autocast_dtype() { return t_compute; }

Tensor autocast_to_compute(const Tensor& t) {
  if (t_compute == DType::f32 || !t.defined() || !is_floating(t.dtype()) ||
      t.dtype() == DType::f64 || t.dtype() == t_compute)
    return t;
  if (t_slab && t.dtype() == DType::f32) {
    Tensor c = t_slab->cast(t, t_compute);
    if (c.defined()) return c;
  }
  return t.to(t_compute);
}

Tensor autocast_from_slab(const Tensor& t) {
  if (t_compute == DType::f32 || !t_slab || !t.defined() || t.dtype() != DType::f32)
    return Tensor();
  return t_slab->cast(t, t_compute);
}

AutocastSlab::AutocastSlab(const Tensor& slab) : previous_(t_slab) {
  // Another slab (f64 parameters, say) is never cast by autocast: the scope covers nothing.
  if (slab.defined() && slab.dim() == 1 && slab.is_contiguous() && slab.dtype() == DType::f32)
    slab_ = slab.detach();
  t_slab = this;
}

AutocastSlab::AutocastSlab(const Tensor& slab, const Tensor& copy) : AutocastSlab(slab) {
  if (!slab_.defined() || !copy.defined()) return;
  ENGINE_CHECK(is_16bit_copy_of(copy, slab_),
               "[autocast] the slab's 16-bit copy must be a contiguous bf16 or f16 tensor of ",
               slab_.numel(), " elements on ", slab_.device().str(), ", got ", describe(copy));
  half_ = copy.detach().reshape(slab_.shape());
}

bool is_16bit_copy_of(const Tensor& copy, const Tensor& slab) {
  return copy.defined() && (copy.dtype() == DType::bf16 || copy.dtype() == DType::f16) &&
         copy.is_contiguous() && copy.numel() == slab.numel() && copy.device() == slab.device();
}

AutocastSlab::~AutocastSlab() { t_slab = previous_; }

Tensor AutocastSlab::cast(const Tensor& t, DType dtype) {
  if (!slab_.defined() || !t.shares_storage(slab_) || t.device() != slab_.device() ||
      t.numel() == 0)
    return Tensor();
  // t's elements must lie in the slab's range of the storage (a view of the slab).
  int64_t lo = t.storage_offset(), hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t span = (t.size(d) - 1) * t.stride(d);
    (span < 0 ? lo : hi) += span;
  }
  const int64_t base = slab_.storage_offset();
  if (lo < base || hi >= base + slab_.numel()) return Tensor();
  if (!half_.defined() || half_.dtype() != dtype) half_ = slab_.to(dtype);  // one kernel
  return cast_precomputed(t, make_view(half_, t.shape(), t.strides(), t.storage_offset() - base));
}

Tensor autocast_to_f32(const Tensor& t) {
  if (t_compute == DType::f32 || !t.defined() ||
      (t.dtype() != DType::bf16 && t.dtype() != DType::f16))
    return t;
  return t.to(DType::f32);
}

DType precision_dtype(const std::string& precision) {
  if (precision == "f32") return DType::f32;
  if (precision == "bf16") return DType::bf16;
  if (precision == "fp16") return DType::f16;
  ENGINE_FAIL("[autocast] precision '", precision, "' is not one of f32, bf16, fp16");
}

}  // namespace engine
