// The cuBLASLt shim of the emulation build. The real libcublasLt.so loads and answers its
// descriptor functions without a GPU (cublasLtMatmulDescCreate / SetAttribute / GetAttribute,
// the matrix layouts, the preferences); only the calls that need a device fail. This file defines
// those -- cublasLtCreate, cublasLtDestroy, cublasLtMatmulAlgoGetHeuristic, cublasLtMatmul -- and
// libcuda_emu is linked ahead of libcublasLt, so the engine's calls land here while the
// descriptors it built stay the real library's.
//
// cublasLtMatmul reads every attribute of the engine's real descriptors back, refuses anything it
// does not implement with CUBLAS_STATUS_NOT_SUPPORTED and a message on stderr (never a silent
// wrong answer), and otherwise enqueues the product on the stream: D = epilogue(alpha op(A) op(B)
// + beta C), column-major, strided batches, f32 / bf16 / f16 inputs with f32 accumulation (f64
// with f64; bf16 / f16 A and B may have f32 C and D), epilogues DEFAULT, BIAS, GELU, GELU_BIAS
// (GELU in cuBLASLt's tanh form) and the bias gradients BGRADA / BGRADB (the sums over k of
// op(A)'s rows / op(B)'s columns written to the bias pointer in C's type, unbatched; with
// EMU_CUBLASLT_NO_BGRAD=1 in the environment the shim refuses them, as a library without an
// algorithm for them would, and with EMU_CUBLASLT_NO_BGRAD=matmul only in cublasLtMatmul, after
// the heuristic offered one, so that both of the engine's fallbacks run too).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "emu/runtime.h"

namespace {

struct Handle {
  int magic = 0x4C74;  // "Lt"
};

bool valid(cublasLtHandle_t h) { return h && reinterpret_cast<Handle*>(h)->magic == 0x4C74; }

cublasStatus_t refuse(const std::string& why) {
  std::fprintf(stderr, "[emu] cublasLtMatmul: not supported by the emulation's cuBLASLt shim: %s\n",
               why.c_str());
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

template <class T>
bool get(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, T& v) {
  size_t written = 0;
  return cublasLtMatmulDescGetAttribute(d, a, &v, sizeof v, &written) == CUBLAS_STATUS_SUCCESS;
}
template <class T>
bool get(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, T& v) {
  size_t written = 0;
  return cublasLtMatrixLayoutGetAttribute(l, a, &v, sizeof v, &written) == CUBLAS_STATUS_SUCCESS;
}

struct Layout {
  cudaDataType_t type{};
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0, stride = 0;
  int32_t batch = 1;
};

size_t type_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_64F:
      return 8;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    default:
      return 0;
  }
}

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return "CUDA_R_32F";
    case CUDA_R_64F:
      return "CUDA_R_64F";
    case CUDA_R_16F:
      return "CUDA_R_16F";
    case CUDA_R_16BF:
      return "CUDA_R_16BF";
    default:
      return "an unsupported data type";
  }
}

bool read_layout(cublasLtMatrixLayout_t l, const char* name, Layout& out, std::string& why) {
  if (!l) {
    why = std::string("matrix layout ") + name + " is null";
    return false;
  }
  uint32_t type = 0;
  int32_t order = 0;
  int64_t plane = 0;
  if (!get(l, CUBLASLT_MATRIX_LAYOUT_TYPE, type) || !get(l, CUBLASLT_MATRIX_LAYOUT_ORDER, order) ||
      !get(l, CUBLASLT_MATRIX_LAYOUT_ROWS, out.rows) ||
      !get(l, CUBLASLT_MATRIX_LAYOUT_COLS, out.cols) ||
      !get(l, CUBLASLT_MATRIX_LAYOUT_LD, out.ld) ||
      !get(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, out.batch) ||
      !get(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, out.stride) ||
      !get(l, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, plane)) {
    why = std::string("matrix layout ") + name + ": an attribute could not be read";
    return false;
  }
  out.type = static_cast<cudaDataType_t>(type);
  if (type_size(out.type) == 0) {
    why = std::string("matrix ") + name + " has data type " + std::to_string(type) +
          " (the shim takes CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF)";
    return false;
  }
  if (order != CUBLASLT_ORDER_COL) {
    why = std::string("matrix ") + name + " has order " + std::to_string(order) +
          " (the shim takes CUBLASLT_ORDER_COL only)";
    return false;
  }
  if (plane != 0) {
    why = std::string("matrix ") + name + " has a plane offset (complex planar layouts)";
    return false;
  }
  if (out.ld < static_cast<int64_t>(std::max<uint64_t>(out.rows, 1))) {
    why = std::string("matrix ") + name + " has ld " + std::to_string(out.ld) + " < rows " +
          std::to_string(out.rows);
    return false;
  }
  if (out.batch < 1) {
    why = std::string("matrix ") + name + " has batch count " + std::to_string(out.batch);
    return false;
  }
  return true;
}

enum class Act { none, gelu_tanh };

// Everything a product needs, read from the descriptors at call time (the caller may destroy
// them as soon as cublasLtMatmul returns).
struct Problem {
  Layout a, b, c, d;
  bool trans_a = false, trans_b = false;
  bool f64 = false;
  bool bias = false;
  char bgrad = 0;  // 'A' or 'B': a bias-gradient epilogue
  Act act = Act::none;
  const void* bias_ptr = nullptr;
  cudaDataType_t bias_type{};
  uint64_t m = 0, n = 0, k = 0;
};

// matmul: for cublasLtMatmul (false: the heuristic's query).
bool parse(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
           cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld, Problem& p, std::string& why,
           bool matmul) {
  if (!op) {
    why = "the matmul descriptor is null";
    return false;
  }
  int32_t compute = 0, scale = 0, pointer_mode = 0, transa = 0, transb = 0, transc = 0, fill = 0;
  uint32_t epilogue = 0;
  int32_t bias_type = -1;
  const void* ptr_attr[8] = {};
  const cublasLtMatmulDescAttributes_t ptr_names[8] = {
      CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
      CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
      CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
      CUBLASLT_MATMUL_DESC_C_SCALE_POINTER,
      CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
      CUBLASLT_MATMUL_DESC_AMAX_D_POINTER,
      CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER,
      CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER};
  const char* ptr_text[8] = {"EPILOGUE_AUX_POINTER",
                             "A_SCALE_POINTER",
                             "B_SCALE_POINTER",
                             "C_SCALE_POINTER",
                             "D_SCALE_POINTER",
                             "AMAX_D_POINTER",
                             "EPILOGUE_AUX_SCALE_POINTER",
                             "EPILOGUE_AUX_AMAX_POINTER"};
  if (!get(op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute) ||
      !get(op, CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale) ||
      !get(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, pointer_mode) ||
      !get(op, CUBLASLT_MATMUL_DESC_TRANSA, transa) ||
      !get(op, CUBLASLT_MATMUL_DESC_TRANSB, transb) ||
      !get(op, CUBLASLT_MATMUL_DESC_TRANSC, transc) ||
      !get(op, CUBLASLT_MATMUL_DESC_FILL_MODE, fill) ||
      !get(op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue) ||
      !get(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias_ptr) ||
      !get(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type)) {
    why = "a matmul descriptor attribute could not be read";
    return false;
  }
  for (int i = 0; i < 8; ++i) {
    if (!get(op, ptr_names[i], ptr_attr[i])) {
      why = std::string("matmul descriptor attribute ") + ptr_text[i] + " could not be read";
      return false;
    }
    if (ptr_attr[i]) {
      why = std::string("CUBLASLT_MATMUL_DESC_") + ptr_text[i] +
            " is set (fp8 scaling and auxiliary epilogue outputs are not emulated)";
      return false;
    }
  }
  if (pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
    why = "pointer mode " + std::to_string(pointer_mode) + " (the shim takes host alpha / beta)";
    return false;
  }
  if (transc != CUBLAS_OP_N || fill != CUBLAS_FILL_MODE_FULL) {
    why = "TRANSC / FILL_MODE other than CUBLAS_OP_N / CUBLAS_FILL_MODE_FULL";
    return false;
  }
  auto trans = [&](int32_t t, const char* name, bool& out) {
    if (t == CUBLAS_OP_N || t == CUBLAS_OP_T) {
      out = t == CUBLAS_OP_T;
      return true;
    }
    why = std::string(name) + " = " + std::to_string(t) + " (the shim takes N or T)";
    return false;
  };
  if (!trans(transa, "TRANSA", p.trans_a) || !trans(transb, "TRANSB", p.trans_b)) return false;
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      break;
    case CUBLASLT_EPILOGUE_BIAS:
      p.bias = true;
      break;
    case CUBLASLT_EPILOGUE_GELU:
      p.act = Act::gelu_tanh;
      break;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      p.bias = true;
      p.act = Act::gelu_tanh;
      break;
    case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB: {
      const char* off = std::getenv("EMU_CUBLASLT_NO_BGRAD");
      if (off && (std::string(off) == "1" || (matmul && std::string(off) == "matmul"))) {
        why = std::string("a bias-gradient epilogue (EMU_CUBLASLT_NO_BGRAD=") + off + ")";
        return false;
      }
      p.bgrad = epilogue == CUBLASLT_EPILOGUE_BGRADA ? 'A' : 'B';
      break;
    }
    default:
      why = "epilogue " + std::to_string(epilogue) +
            " (the shim takes DEFAULT, BIAS, GELU, GELU_BIAS, BGRADA, BGRADB)";
      return false;
  }
  if (!read_layout(la, "A", p.a, why) || !read_layout(lb, "B", p.b, why) ||
      !read_layout(lc, "C", p.c, why) || !read_layout(ld, "D", p.d, why))
    return false;
  const cudaDataType_t t = p.a.type;
  // One type, or 16-bit A and B with an f32 C and D (f32 accumulation stored in f32).
  const bool f32_out = (t == CUDA_R_16BF || t == CUDA_R_16F) && p.c.type == CUDA_R_32F;
  if (p.b.type != t || p.c.type != p.d.type || (p.c.type != t && !f32_out)) {
    why = std::string("mixed matrix types: A ") + type_name(p.a.type) + ", B " +
          type_name(p.b.type) + ", C " + type_name(p.c.type) + ", D " + type_name(p.d.type) +
          " (the shim takes one type, or 16-bit A and B with f32 C and D)";
    return false;
  }
  if (f32_out && (p.bias || p.act != Act::none)) {
    why = "an epilogue with 16-bit A and B and an f32 C";
    return false;
  }
  if (p.bgrad) {
    // The gradient's elements are C's type (cuBLASLt's contract).
    const cudaDataType_t want = p.c.type;
    if (bias_type != -1 && static_cast<cudaDataType_t>(bias_type) != want) {
      why = std::string("bias-gradient data type ") +
            type_name(static_cast<cudaDataType_t>(bias_type)) + " with a " + type_name(want) + " C";
      return false;
    }
    p.bias_type = want;
    if (!p.bias_ptr) {
      why = "a bias-gradient epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER";
      return false;
    }
    if (p.a.batch != 1) {
      why = "a bias-gradient epilogue on a batched product";
      return false;
    }
  }
  p.f64 = t == CUDA_R_64F;
  const bool types_ok = p.f64 ? compute == CUBLAS_COMPUTE_64F && scale == CUDA_R_64F
                              : compute == CUBLAS_COMPUTE_32F && scale == CUDA_R_32F;
  if (!types_ok) {
    why = std::string("compute type ") + std::to_string(compute) + " / scale type " +
          std::to_string(scale) + " with " + type_name(t) +
          " matrices (the shim takes COMPUTE_32F + R_32F scale for f32/bf16/f16, COMPUTE_64F + "
          "R_64F for f64)";
    return false;
  }
  if (p.bias) {
    p.bias_type = bias_type == -1 ? t : static_cast<cudaDataType_t>(bias_type);
    if (p.bias_type != t) {
      why = std::string("bias data type ") + type_name(p.bias_type) + " with " + type_name(t) +
            " matrices";
      return false;
    }
    if (!p.bias_ptr) {
      why = "a bias epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER";
      return false;
    }
  }
  // D (m x n) = op(A) (m x k) op(B) (k x n).
  p.m = p.d.rows;
  p.n = p.d.cols;
  p.k = p.trans_a ? p.a.rows : p.a.cols;
  const uint64_t am = p.trans_a ? p.a.cols : p.a.rows;
  const uint64_t bk = p.trans_b ? p.b.cols : p.b.rows, bn = p.trans_b ? p.b.rows : p.b.cols;
  if (am != p.m || bk != p.k || bn != p.n || p.c.rows != p.m || p.c.cols != p.n) {
    why = "shapes do not match: op(A) " + std::to_string(am) + "x" + std::to_string(p.k) +
          ", op(B) " + std::to_string(bk) + "x" + std::to_string(bn) + ", C " +
          std::to_string(p.c.rows) + "x" + std::to_string(p.c.cols) + ", D " + std::to_string(p.m) +
          "x" + std::to_string(p.n);
    return false;
  }
  if (p.b.batch != p.a.batch || p.c.batch != p.a.batch || p.d.batch != p.a.batch) {
    why = "batch counts differ: A " + std::to_string(p.a.batch) + ", B " +
          std::to_string(p.b.batch) + ", C " + std::to_string(p.c.batch) + ", D " +
          std::to_string(p.d.batch);
    return false;
  }
  return true;
}

float ld(const void* p, cudaDataType_t t, size_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(p)[i];
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return 0.f;
  }
}

void st(void* p, cudaDataType_t t, size_t i, float v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(p)[i] = v;
      break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
      break;
    case CUDA_R_16F:
      static_cast<__half*>(p)[i] = __float2half(v);
      break;
    default:
      break;
  }
}

template <class S>
S gelu_tanh(S x) {
  const S k = static_cast<S>(0.7978845608028654);
  return static_cast<S>(0.5) * x *
         (static_cast<S>(1) + std::tanh(k * (x + static_cast<S>(0.044715) * x * x * x)));
}

// The bytes a layout's batch of matrices spans.
size_t span_bytes(const Layout& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  const uint64_t last = static_cast<uint64_t>(l.batch - 1) * static_cast<uint64_t>(l.stride) +
                        (l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows;
  return last * type_size(l.type);
}

// S: the accumulation type (float, or double for f64 matrices).
template <class S>
void compute(const Problem& p, S alpha, S beta, const void* A, const void* B, const void* C,
             void* D) {
  auto load_as = [&](const void* base, cudaDataType_t t, size_t i) -> S {
    if constexpr (std::is_same_v<S, double>)
      return static_cast<const double*>(base)[i];
    else
      return ld(base, t, i);
  };
  auto load = [&](const void* base, size_t i) -> S { return load_as(base, p.a.type, i); };
  std::vector<S> opa(p.m * p.k), opb(p.n * p.k);  // op(A) rows, op(B) columns, contiguous in k
  for (int64_t bi = 0; bi < p.a.batch; ++bi) {
    const size_t oa = bi * p.a.stride, ob = bi * p.b.stride, oc = bi * p.c.stride,
                 od = bi * p.d.stride;
    for (uint64_t i = 0; i < p.m; ++i)
      for (uint64_t l = 0; l < p.k; ++l)
        opa[i * p.k + l] = load(A, oa + (p.trans_a ? l + i * p.a.ld : i + l * p.a.ld));
    for (uint64_t j = 0; j < p.n; ++j)
      for (uint64_t l = 0; l < p.k; ++l)
        opb[j * p.k + l] = load(B, ob + (p.trans_b ? j + l * p.b.ld : l + j * p.b.ld));
    for (uint64_t j = 0; j < p.n; ++j) {
      for (uint64_t i = 0; i < p.m; ++i) {
        S acc = 0;
        const S* ra = &opa[i * p.k];
        const S* cb = &opb[j * p.k];
        for (uint64_t l = 0; l < p.k; ++l) acc += ra[l] * cb[l];
        S v = alpha * acc;
        if (beta != 0) v += beta * load_as(C, p.c.type, oc + i + j * p.c.ld);
        if (p.bias) v += load(p.bias_ptr, i);  // one per row of D
        if (p.act == Act::gelu_tanh) v = gelu_tanh(v);
        const size_t di = od + i + j * p.d.ld;
        if constexpr (std::is_same_v<S, double>)
          static_cast<double*>(D)[di] = v;
        else
          st(D, p.d.type, di, v);
      }
    }
    // The bias gradient: sums over k of op(A)'s rows (m) or op(B)'s columns (n), in k order.
    if (p.bgrad) {
      const bool on_a = p.bgrad == 'A';
      const uint64_t count = on_a ? p.m : p.n;
      for (uint64_t r = 0; r < count; ++r) {
        const S* row = on_a ? &opa[r * p.k] : &opb[r * p.k];
        S s = 0;
        for (uint64_t l = 0; l < p.k; ++l) s += row[l];
        if constexpr (std::is_same_v<S, double>)
          static_cast<double*>(const_cast<void*>(p.bias_ptr))[r] = s;
        else
          st(const_cast<void*>(p.bias_ptr), p.bias_type, r, s);
      }
    }
  }
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = reinterpret_cast<cublasLtHandle_t>(new Handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete reinterpret_cast<Handle*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t* results,
    int* returned) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requested < 1 || !results || !returned || !preference) return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  std::string why;
  if (!parse(op, a, b, c, d, p, why, false)) {
    *returned = 0;
    return refuse(why);
  }
  std::memset(&results[0], 0, sizeof results[0]);
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].workspaceSize = 0;
  results[0].wavesCount = 1.f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
    cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
    const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
    const cublasLtMatmulAlgo_t*, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  std::string why;
  if (!parse(op, a, b, c, d, p, why, true)) return refuse(why);
  double al = 0, be = 0;
  if (p.f64) {
    std::memcpy(&al, alpha, sizeof al);
    std::memcpy(&be, beta, sizeof be);
  } else {
    float a32 = 0, b32 = 0;
    std::memcpy(&a32, alpha, sizeof a32);
    std::memcpy(&b32, beta, sizeof b32);
    al = a32, be = b32;
  }
  (void)workspace, (void)workspace_bytes;
  emu::stream_enqueue(
      stream,
      [p, al, be, A, B, C, D] {
        // A bad pointer faults the "kernel", as it would on the device.
        const struct {
          const void* ptr;
          const Layout& l;
          const char* name;
          bool read;
        } operands[4] = {{A, p.a, "A", p.k > 0},
                         {B, p.b, "B", p.k > 0},
                         {C, p.c, "C", be != 0},
                         {D, p.d, "D", true}};
        for (const auto& o : operands) {
          const size_t bytes = span_bytes(o.l);
          if (o.read && bytes && !emu::is_device_range(o.ptr, bytes))
            throw emu::Fault{std::string("cublasLtMatmul: matrix ") + o.name + " at " +
                             std::to_string(reinterpret_cast<uintptr_t>(o.ptr)) + " (" +
                             std::to_string(bytes) + " bytes) is not device memory"};
        }
        if (p.bias && !emu::is_device_range(p.bias_ptr, p.m * type_size(p.bias_type)))
          throw emu::Fault{"cublasLtMatmul: the bias is not device memory"};
        if (p.bgrad && !emu::is_device_range(p.bias_ptr,
                                             (p.bgrad == 'A' ? p.m : p.n) * type_size(p.bias_type)))
          throw emu::Fault{"cublasLtMatmul: the bias gradient is not device memory"};
        if (p.f64)
          compute<double>(p, al, be, A, B, C, D);
        else
          compute<float>(p, static_cast<float>(al), static_cast<float>(be), A, B, C, D);
      },
      "cublasLtMatmul");
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
