// Element types known to the engine, chosen at runtime (one binary holds f32 master weights and
// bf16/f16 compute copies). Half types are stored as 16-bit patterns; arithmetic on them happens
// in kernels that convert to f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace engine {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8 };

inline constexpr int kNumDTypes = 7;

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
bool is_floating(DType t);  // f32, f64, bf16, f16
bool is_integral(DType t);  // i32, i64, u8
// The dtype two floating dtypes meet in (PyTorch's promotion): the wider one; bf16 with f16 -> f32.
DType promote_floating(DType a, DType b);

// Storage types for the 16-bit floats (bit patterns; see engine/cpu/convert.h for arithmetic).
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<bf16_t> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16_t> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

}  // namespace engine
