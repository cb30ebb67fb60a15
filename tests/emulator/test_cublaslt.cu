// [emulator] The cuBLASLt shim: it computes from the real library's descriptors, and refuses a
// descriptor it does not implement (CUBLAS_STATUS_NOT_SUPPORTED, nothing computed) instead of
// giving a wrong answer; a bad device pointer faults the stream like a kernel would.
#include <cublasLt.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <vector>

#include "emu/runtime.h"

namespace {

// D (2 x 2) = A (2 x 3) B (3 x 2), column-major f32, with the epilogue and types given.
struct Case {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  float *pa = nullptr, *pb = nullptr, *pd = nullptr;

  explicit Case(cudaDataType_t b_type = CUDA_R_32F) {
    REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 2, 3, 2) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&b, b_type, 3, 2, 3) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, 2, 2, 2) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cudaMalloc(&pa, 6 * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&pb, 6 * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&pd, 4 * sizeof(float)) == cudaSuccess);
    const std::vector<float> ha = {1, 2, 3, 4, 5, 6}, hb = {1, 0, 1, 0, 1, 1};
    REQUIRE(cudaMemcpy(pa, ha.data(), 24, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(pb, hb.data(), 24, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemset(pd, 0, 16) == cudaSuccess);
  }
  ~Case() {
    cudaFree(pa);
    cudaFree(pb);
    cudaFree(pd);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
  }
  cublasStatus_t run(const void* a_ptr = nullptr) {
    const float one = 1, zero = 0;
    return cublasLtMatmul(h, op, &one, a_ptr ? a_ptr : pa, a, pb, b, &zero, pd, d, pd, d, nullptr,
                          nullptr, 0, nullptr);
  }
  std::vector<float> result() {
    std::vector<float> r(4);
    REQUIRE(cudaMemcpy(r.data(), pd, 16, cudaMemcpyDeviceToHost) == cudaSuccess);
    return r;
  }
};

}  // namespace

TEST_CASE("the cuBLASLt shim computes from the real descriptors", "[emulator]") {
  Case c;
  REQUIRE(c.run() == CUBLAS_STATUS_SUCCESS);
  // A = [1 3 5; 2 4 6], B = [1 0; 0 1; 1 1] (column-major): D = [6 8; 8 10].
  REQUIRE(c.result() == std::vector<float>{6, 8, 8, 10});
}

TEST_CASE("the cuBLASLt shim's bias-gradient epilogues: the sums over k of op(A) or op(B)",
          "[emulator]") {
  for (const cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
    Case c;
    float* grad = nullptr;
    REQUIRE(cudaMalloc(&grad, 2 * sizeof(float)) == cudaSuccess);
    REQUIRE(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &grad,
                                           sizeof grad) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(c.run() == CUBLAS_STATUS_SUCCESS);
    REQUIRE(c.result() == std::vector<float>{6, 8, 8, 10});  // the product as without it
    std::vector<float> got(2);
    REQUIRE(cudaMemcpy(got.data(), grad, 8, cudaMemcpyDeviceToHost) == cudaSuccess);
    // A = [1 3 5; 2 4 6]: its rows sum to 9, 12; B = [1 0; 0 1; 1 1]: its columns to 2, 2.
    REQUIRE(got ==
            (e == CUBLASLT_EPILOGUE_BGRADA ? std::vector<float>{9, 12} : std::vector<float>{2, 2}));
    // Refused when the environment asks it to (the engine's fallback is tested with it).
    setenv("EMU_CUBLASLT_NO_BGRAD", "1", 1);
    REQUIRE(c.run() == CUBLAS_STATUS_NOT_SUPPORTED);
    unsetenv("EMU_CUBLASLT_NO_BGRAD");
    // A bias-gradient type other than C's.
    const cudaDataType_t bf16 = CUDA_R_16BF;
    REQUIRE(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bf16,
                                           sizeof bf16) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(c.run() == CUBLAS_STATUS_NOT_SUPPORTED);
    cudaFree(grad);
  }
}

TEST_CASE("the cuBLASLt shim refuses what it does not implement", "[emulator]") {
  SECTION("an epilogue it does not emulate") {
    Case c;
    const cublasLtEpilogue_t relu = CUBLASLT_EPILOGUE_RELU;
    REQUIRE(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu,
                                           sizeof relu) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(c.run() == CUBLAS_STATUS_NOT_SUPPORTED);
    REQUIRE(c.result() == std::vector<float>{0, 0, 0, 0});  // nothing computed
  }
  SECTION("mixed operand types") {
    Case c(CUDA_R_16BF);
    REQUIRE(c.run() == CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("row-major order") {
    Case c;
    const cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.a, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(c.run() == CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("device-side alpha / beta") {
    Case c;
    const cublasLtPointerMode_t device = CUBLASLT_POINTER_MODE_DEVICE;
    REQUIRE(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &device,
                                           sizeof device) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(c.run() == CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("shapes that do not chain") {
    Case c;
    const uint64_t rows = 4;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.b, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows,
                                             sizeof rows) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(c.run() == CUBLAS_STATUS_NOT_SUPPORTED);
  }
}

TEST_CASE("a host pointer given to the cuBLASLt shim faults the stream", "[emulator]") {
  Case c;
  std::vector<float> host(6, 1.f);
  REQUIRE(c.run(host.data()) == CUBLAS_STATUS_SUCCESS);  // asynchronous, as on the device
  const cudaError_t e = cudaDeviceSynchronize();
  REQUIRE(e == cudaErrorLaunchFailure);
  REQUIRE_THAT(cudaGetErrorString(e),
               Catch::Contains("matrix A") && Catch::Contains("is not device memory"));
  emu::clear_sticky_error();
}
