// Runtime dtype -> C++ type dispatch, in one place. Kernels write
//
//   dispatch_floating(x.dtype(), "gelu", [&]<class T>() { ... T ... });
//
// CPU kernels compute in f32 or f64; bf16/f16 compute lives in the CUDA kernels (the CPU backend
// stores and converts them).
#pragma once

#include <cstdint>

#include "engine/dtype.h"
#include "engine/error.h"

namespace engine {

template <class F>
decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    default:
      ENGINE_FAIL("[", op, "] CPU kernels compute in f32 or f64, got ", dtype_name(t),
                  " (convert with .to(DType::f32))");
  }
}

template <class F>
decltype(auto) dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32:
      return f.template operator()<int32_t>();
    case DType::i64:
      return f.template operator()<int64_t>();
    default:
      ENGINE_FAIL("[", op, "] expected an i32 or i64 index tensor, got ", dtype_name(t));
  }
}

// Every storage type, half types as their bit-pattern structs (bf16_t, f16_t): for copies,
// conversions and masks, which read any dtype.
template <class F>
decltype(auto) dispatch_any(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    case DType::bf16:
      return f.template operator()<bf16_t>();
    case DType::f16:
      return f.template operator()<f16_t>();
    case DType::i32:
      return f.template operator()<int32_t>();
    case DType::i64:
      return f.template operator()<int64_t>();
    case DType::u8:
      return f.template operator()<uint8_t>();
  }
  ENGINE_FAIL("[dispatch] unknown dtype code ", static_cast<int>(t));
}

}  // namespace engine
