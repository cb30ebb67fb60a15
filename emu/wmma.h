// The warp matrix functions (CUDA's <mma.h>, namespace nvcuda::wmma) on the SIMT emulator: the
// m16n16k16 shape with __half / __nv_bfloat16 multiplicands and a float accumulator, the subset
// the engine's tensor-core kernels use. Included through engine/cuda/wmma.cuh, never by name.
//
// What CUDA leaves unspecified, the emulator fixes in a way a kernel cannot rely on by accident:
//   - a fragment's elements are spread over the warp's lanes in an order of the emulator's own
//     (lane l, element e: tile element e * 32 + l, row-major over the tile), unlike any GPU's, so
//     a kernel that reads or writes fragment elements as if it knew the layout gets wrong results
//     here (elementwise ops applied to every element alike work, as they do on the GPU);
//   - every call is warp-collective: all 32 lanes must make it, at the same call site, with the
//     same pointer and leading dimension (a fault otherwise, naming the function);
//   - the pointer must be 256-bit aligned and ldm a multiple of 16 bytes (CUDA's requirements;
//     a fault otherwise);
//   - mma_sync gathers the warp's fragments through a per-warp staging area between two warp
//     barriers and computes D = A B + C per element in float, k in order (products of 16-bit
//     values are exact in float; the GPU's summation order differs, within float rounding).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "emu/simt.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

inline constexpr int kLanes = 32;
inline constexpr int kTile = 256;  // 16 x 16 elements
inline constexpr int kPerLane = kTile / kLanes;

inline int linear_thread() {
  return static_cast<int>(::emu::t_thread_idx.x +
                          ::emu::t_block_dim.x * (::emu::t_thread_idx.y +
                                                  ::emu::t_block_dim.y * ::emu::t_thread_idx.z));
}
inline int lane() { return linear_thread() % kLanes; }
inline int warp() { return linear_thread() / kLanes; }

// The block's staging area, one slot per warp (a block's fibers all run on one worker thread, one
// block at a time): three tiles of floats for mma_sync, and each lane's pointer and ldm for the
// uniformity check.
struct WarpStage {
  float a[kTile], b[kTile], c[kTile];
  const void* ptr[kLanes];
  unsigned ldm[kLanes];
};
inline WarpStage& stage() {
  static thread_local WarpStage s[32];
  return s[warp() % 32];
}

[[noreturn]] inline void fail(const char* fn, const std::string& what) {
  ::emu::device_fault(std::string("wmma::") + fn + ": " + what);
}

// Every lane arrives (a warp barrier over all 32 lanes), then checks that every lane passed the
// same pointer and ldm, the pointer 32-byte aligned and ldm a whole number of 16 bytes.
inline void enter(const char* fn, const void* p, unsigned ldm, size_t elem) {
  ::emu::syncwarp(::emu::Site{__FILE__, __LINE__}, 0xffffffffu);
  WarpStage& s = stage();
  s.ptr[lane()] = p;
  s.ldm[lane()] = ldm;
  ::emu::syncwarp(::emu::Site{__FILE__, __LINE__}, 0xffffffffu);
  for (int l = 0; l < kLanes; ++l)
    if (s.ptr[l] != s.ptr[0] || s.ldm[l] != s.ldm[0])
      fail(fn, "lane " + std::to_string(l) + " passed another pointer or ldm than lane 0 (the " +
                   "arguments of a warp matrix function must be warp-uniform)");
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) fail(fn, "the pointer is not 256-bit aligned");
  if ((ldm * elem) % 16 != 0 || ldm < 16)
    fail(fn, "ldm " + std::to_string(ldm) + " is not a multiple of " + std::to_string(16 / elem) +
                 " elements of at least 16");
  ::emu::syncwarp(::emu::Site{__FILE__, __LINE__}, 0xffffffffu);  // the stage is free again
}

// An element a warp matrix function reads or writes: when it lies in the block's dynamic shared
// memory, the same check as a SharedPtr access (bounds, and no read before a write), so a tile
// stored by store_matrix_sync reads back through SharedPtr and a load of a region nothing wrote
// faults.
template <class T>
inline T& element(T* base, size_t index, bool write) {
  T* p = base + index;
  const auto* lo = static_cast<const unsigned char*>(::emu::dynamic_shared_base());
  const auto* q = reinterpret_cast<const unsigned char*>(p);
  if (lo != nullptr && q >= lo && q < lo + ::emu::dynamic_shared_bytes())
    ::emu::shared_check(p, sizeof(T), write);
  return *p;
}
template <class T>
inline const T& element(const T* base, size_t index) {
  return element(const_cast<T*>(base), index, false);
}

template <class T>
inline float to_float(T v) {
  return static_cast<float>(v);
}

// Row / column of this lane's element e in the 16 x 16 tile.
inline int row_of(int e) { return (e * kLanes + lane()) / 16; }
inline int col_of(int e) { return (e * kLanes + lane()) % 16; }

}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator's wmma has the m16n16k16 shape only");
  static_assert(std::is_same_v<Use, accumulator>
                    ? std::is_same_v<T, float>
                    : (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>),
                "the emulator's wmma: __half / __nv_bfloat16 multiplicands, float accumulators");

 public:
  using element_type = T;
  using storage_element_type = T;
  static constexpr int num_elements = detail::kPerLane;
  T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const T& v) {
  for (int e = 0; e < f.num_elements; ++e) f.x[e] = v;
}

// matrix_a / matrix_b: the layout comes with the fragment's type.
template <class Use, int M, int N, int K, class T, class Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load takes a layout_t");
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                "a multiplicand fragment needs row_major or col_major");
  detail::enter("load_matrix_sync", p, ldm, sizeof(T));
  for (int e = 0; e < f.num_elements; ++e) {
    const int r = detail::row_of(e), c = detail::col_of(e);
    f.x[e] = detail::element(
        p, std::is_same_v<Layout, row_major> ? size_t(r) * ldm + c : size_t(c) * ldm + r);
  }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  detail::enter("load_matrix_sync", p, ldm, sizeof(float));
  for (int e = 0; e < f.num_elements; ++e) {
    const int r = detail::row_of(e), c = detail::col_of(e);
    f.x[e] =
        detail::element(p, layout == mem_row_major ? size_t(r) * ldm + c : size_t(c) * ldm + r);
  }
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  detail::enter("store_matrix_sync", p, ldm, sizeof(float));
  for (int e = 0; e < f.num_elements; ++e) {
    const int r = detail::row_of(e), c = detail::col_of(e);
    detail::element(p, layout == mem_row_major ? size_t(r) * ldm + c : size_t(c) * ldm + r, true) =
        f.x[e];
  }
}

// D = A B + C (d may be c).
template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  using detail::kLanes;
  ::emu::syncwarp(::emu::Site{__FILE__, __LINE__}, 0xffffffffu);
  detail::WarpStage& s = detail::stage();
  const int l = detail::lane();
  for (int e = 0; e < detail::kPerLane; ++e) {
    s.a[e * kLanes + l] = detail::to_float(a.x[e]);
    s.b[e * kLanes + l] = detail::to_float(b.x[e]);
    s.c[e * kLanes + l] = c.x[e];
  }
  ::emu::syncwarp(::emu::Site{__FILE__, __LINE__}, 0xffffffffu);
  float out[detail::kPerLane];
  for (int e = 0; e < detail::kPerLane; ++e) {
    const int i = detail::row_of(e), j = detail::col_of(e);
    float acc = s.c[i * 16 + j];
    for (int k = 0; k < 16; ++k) acc += s.a[i * 16 + k] * s.b[k * 16 + j];
    out[e] = acc;
  }
  ::emu::syncwarp(::emu::Site{__FILE__, __LINE__}, 0xffffffffu);  // every lane has read the stage
  for (int e = 0; e < detail::kPerLane; ++e) d.x[e] = out[e];
}

}  // namespace nvcuda::wmma
