// NCCL collectives for CUDA tensors (see nccl.h). The engine's kernels run on the device's compute
// stream (context.h); collectives run on its communication stream, ordered after the compute
// queued so far by an event, so backward keeps computing while a gradient bucket is reduced.
#include <nccl.h>

#include <cstring>
#include <vector>

#include "engine/cuda/allocator.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/nccl.h"
#include "engine/error.h"

#if defined(ENGINE_WITH_NCCL)

#define ENGINE_NCCL_CHECK(call)                                                        \
  do {                                                                                 \
    ncclResult_t engine_nr_ = (call);                                                  \
    if (engine_nr_ != ncclSuccess)                                                     \
      ENGINE_FAIL("[nccl] ", #call, " failed: ", ncclGetErrorString(engine_nr_), " (", \
                  ncclGetLastError(nullptr), ") at ", __FILE__, ":", __LINE__);        \
  } while (0)

namespace engine::cuda {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  ENGINE_FAIL("[nccl] unsupported dtype ", dtype_name(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

class NcclWork final : public CommWork {
 public:
  NcclWork(Tensor keep, cudaEvent_t done, int device)
      : keep_(std::move(keep)), done_(done), device_(device) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  void wait() override {
    ENGINE_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(device_), done_, 0));
  }
  bool test() override { return cudaEventQuery(done_) == cudaSuccess; }

 private:
  Tensor keep_;  // alive until the collective is done with its memory
  cudaEvent_t done_;
  int device_;
};

class Channel final : public NcclChannel {
 public:
  Channel(int rank, int size, int device, const ncclUniqueId& id) : device_(device) {
    ENGINE_CUDA_CHECK(cudaSetDevice(device));
    stream_ = context(device).comm;  // the device's communication stream
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    ENGINE_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size, id, rank, &config));
  }
  ~Channel() override {
    if (comm_) ncclCommDestroy(comm_);
  }

  std::unique_ptr<CommWork> all_reduce_async(const Tensor& t, ReduceOp op) override {
    check(t, "all_reduce");
    order_after_compute();
    ENGINE_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                                    nccl_type(t.dtype()), nccl_op(op), comm_, stream_));
    return finish(t);
  }

  void broadcast(const Tensor& t, int root) override {
    check(t, "broadcast");
    order_after_compute();
    ENGINE_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                                    nccl_type(t.dtype()), root, comm_, stream_));
    finish(t)->wait();
  }

  std::string async_error() override {
    ncclResult_t state = ncclSuccess;
    if (!comm_ || ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state == ncclSuccess)
      return "";
    return std::string(ncclGetErrorString(state));
  }

  void abort() override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  void check(const Tensor& t, const char* what) const {
    ENGINE_CHECK(t.device().is_cuda() && t.device().index == device_, "[nccl] ", what,
                 ": the tensor is on ", t.device().str(), ", this rank's GPU is cuda:", device_);
    ENGINE_CHECK(t.is_contiguous(), "[nccl] ", what, " needs a contiguous tensor");
  }
  void order_after_compute() {
    cudaEvent_t ready;
    ENGINE_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    ENGINE_CUDA_CHECK(cudaEventRecord(ready, compute_stream(device_)));
    ENGINE_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);  // released once the wait has been recorded
  }
  std::unique_ptr<CommWork> finish(const Tensor& t) {
    // The collective reads and writes t's memory on the communication stream: the caching
    // allocator must not hand it out again before that stream has passed this point.
    caching_allocator(device_).record_stream(t.storage()->data(), stream_);
    cudaEvent_t done;
    ENGINE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    ENGINE_CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_unique<NcclWork>(t, done, device_);
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<NcclChannel> NcclChannel::create(
    int rank, int size, int device, const std::function<void(void*, size_t)>& broadcast_bytes) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank == 0) ENGINE_NCCL_CHECK(ncclGetUniqueId(&id));
  broadcast_bytes(&id, sizeof id);
  return std::make_unique<Channel>(rank, size, device, id);
}

}  // namespace engine::cuda

#endif  // ENGINE_WITH_NCCL
