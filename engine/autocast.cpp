// The per-thread autocast scope (see autocast.h).
#include "engine/autocast.h"

#include "engine/error.h"

namespace engine {
namespace {
thread_local DType t_compute = DType::f32;
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
  return t.to(t_compute);
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
