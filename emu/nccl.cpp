// The NCCL shim of the emulation build: the subset of NCCL's API the engine uses (and the usual
// companions), over MPI. A communicator is a duplicate of MPI_COMM_WORLD checked against the
// unique id rank 0 made; a collective is enqueued on its CUDA stream (emu::stream_enqueue), so it
// runs in stream order after the kernels that produced its data, and reduces the device buffers
// (host memory here) with MPI: f32 / f64 / i32 / i64 / u8 natively, bf16 / f16 through f32.
// So the engine's GPU data-parallel path -- its streams, events, buckets, the order of its
// collectives and its failure handling -- runs under `mpirun -np 2` without a GPU. An MPI failure
// inside a collective becomes the communicator's asynchronous error (ncclCommGetAsyncError), as
// a network fault does in NCCL.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emu/runtime.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 0, device = 0;
  std::atomic<int> async{ncclSuccess};
  std::atomic<bool> aborted{false};
};

namespace {

thread_local std::string t_last_error;

ncclResult_t fail(ncclResult_t code, std::string what) {
  t_last_error = std::move(what);
  return code;
}

constexpr char kMagic[] = "engine-emu-nccl";

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

// The MPI type a buffer of `t` is reduced in (bf16 / f16: converted to f32 first).
MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return MPI_INT8_T;
    case ncclUint8:
      return MPI_UINT8_T;
    case ncclInt32:
      return MPI_INT32_T;
    case ncclUint32:
      return MPI_UINT32_T;
    case ncclInt64:
      return MPI_INT64_T;
    case ncclUint64:
      return MPI_UINT64_T;
    case ncclFloat32:
    case ncclFloat16:
    case ncclBfloat16:
      return MPI_FLOAT;
    case ncclFloat64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
    case ncclAvg:
      return MPI_SUM;
    case ncclProd:
      return MPI_PROD;
    case ncclMax:
      return MPI_MAX;
    case ncclMin:
      return MPI_MIN;
    default:
      return MPI_OP_NULL;
  }
}

ncclResult_t check_comm(ncclComm_t comm, const char* call) {
  if (!comm || comm->mpi == MPI_COMM_NULL)
    return fail(ncclInvalidArgument, std::string(call) + ": invalid communicator");
  if (comm->aborted) return fail(ncclInvalidUsage, std::string(call) + ": communicator aborted");
  return ncclSuccess;
}

// Inside stream work: an MPI error marks the communicator and faults the stream.
void mpi_check(ncclComm_t comm, int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  comm->async = ncclRemoteError;
  throw emu::Fault{std::string("[emu] nccl: ") + call + " failed: " + std::string(text, len)};
}

void to_float(const void* src, ncclDataType_t t, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = t == ncclBfloat16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(src)[i])
                               : __half2float(static_cast<const __half*>(src)[i]);
}

void from_float(const float* src, ncclDataType_t t, void* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (t == ncclBfloat16)
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16(src[i]);
    else
      static_cast<__half*>(dst)[i] = __float2half(src[i]);
  }
}

template <class T>
void divide(void* p, size_t n, int by) {
  T* q = static_cast<T*>(p);
  for (size_t i = 0; i < n; ++i) q[i] = static_cast<T>(q[i] / static_cast<T>(by));
}

// recv = reduce(send) over the ranks, on the host thread that runs the stream's work.
void all_reduce_now(ncclComm_t comm, const void* send, void* recv, size_t count, ncclDataType_t t,
                    ncclRedOp_t op) {
  const size_t bytes = count * type_size(t);
  if (!emu::is_device_range(send, bytes) || !emu::is_device_range(recv, bytes))
    throw emu::Fault{"[emu] nccl: ncclAllReduce: a buffer of " + std::to_string(bytes) +
                     " bytes is not device memory"};
  const int n = static_cast<int>(count);
  if (t == ncclBfloat16 || t == ncclFloat16) {
    std::vector<float> buf(count);
    to_float(send, t, buf.data(), count);
    mpi_check(comm, MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, mpi_op(op), comm->mpi),
              "MPI_Allreduce");
    if (op == ncclAvg)
      for (float& v : buf) v /= static_cast<float>(comm->size);
    from_float(buf.data(), t, recv, count);
    return;
  }
  if (send != recv) std::memcpy(recv, send, bytes);
  mpi_check(comm, MPI_Allreduce(MPI_IN_PLACE, recv, n, mpi_type(t), mpi_op(op), comm->mpi),
            "MPI_Allreduce");
  if (op != ncclAvg) return;
  switch (t) {
    case ncclFloat32:
      return divide<float>(recv, count, comm->size);
    case ncclFloat64:
      return divide<double>(recv, count, comm->size);
    case ncclInt32:
      return divide<int32_t>(recv, count, comm->size);
    case ncclInt64:
      return divide<int64_t>(recv, count, comm->size);
    default:
      return divide<uint8_t>(recv, count, comm->size);
  }
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: null pointer");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: null pointer");
  int ready = 0;
  MPI_Initialized(&ready);
  if (!ready)
    return fail(ncclInvalidUsage,
                "ncclGetUniqueId: the emulated NCCL runs over MPI, "
                "which is not initialised");
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, kMagic, sizeof kMagic);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::memcpy(id->internal + sizeof kMagic, &world, sizeof world);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t*) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRankConfig: null communicator");
  *comm = nullptr;
  int ready = 0;
  MPI_Initialized(&ready);
  if (!ready)
    return fail(ncclInvalidUsage,
                "ncclCommInitRankConfig: MPI is not initialised (the "
                "emulated NCCL runs over it)");
  if (std::memcmp(id.internal, kMagic, sizeof kMagic) != 0)
    return fail(ncclInvalidArgument,
                "ncclCommInitRankConfig: the unique id was not made by "
                "ncclGetUniqueId (was it broadcast from rank 0?)");
  int world = 0, world_rank = 0, id_world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::memcpy(&id_world, id.internal + sizeof kMagic, sizeof id_world);
  if (nranks != world || id_world != world || rank != world_rank)
    return fail(ncclInvalidArgument,
                "ncclCommInitRankConfig: rank " + std::to_string(rank) + " of " +
                    std::to_string(nranks) + ", but MPI's world is rank " +
                    std::to_string(world_rank) + " of " + std::to_string(world) +
                    " (the emulation maps a communicator onto MPI_COMM_WORLD)");
  auto* c = new ncclComm;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi) != MPI_SUCCESS) {
    delete c;
    return fail(ncclSystemError, "ncclCommInitRankConfig: MPI_Comm_dup failed");
  }
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  c->rank = rank;
  c->size = nranks;
  cudaGetDevice(&c->device);
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (comm->mpi != MPI_COMM_NULL && !comm->aborted) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm->mpi);
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm->aborted = true;  // no MPI call: the peers may be gone
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (!comm || !state) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  *state = static_cast<ncclResult_t>(comm->async.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (const ncclResult_t r = check_comm(comm, "ncclCommCount"); r != ncclSuccess) return r;
  if (!count) return fail(ncclInvalidArgument, "ncclCommCount: null pointer");
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (const ncclResult_t r = check_comm(comm, "ncclCommUserRank"); r != ncclSuccess) return r;
  if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: null pointer");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (const ncclResult_t r = check_comm(comm, "ncclCommCuDevice"); r != ncclSuccess) return r;
  if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: null pointer");
  *device = comm->device;
  return ncclSuccess;
}

// Collectives are enqueued one by one on their streams; a group changes nothing here.
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t r = check_comm(comm, "ncclAllReduce"); r != ncclSuccess) return r;
  if (type_size(type) == 0 || mpi_type(type) == MPI_DATATYPE_NULL)
    return fail(ncclInvalidArgument,
                "ncclAllReduce: data type " + std::to_string(type) + " is not emulated");
  if (mpi_op(op) == MPI_OP_NULL)
    return fail(ncclInvalidArgument,
                "ncclAllReduce: reduction " + std::to_string(op) + " is not emulated");
  if (count > static_cast<size_t>(INT32_MAX))
    return fail(ncclInvalidArgument, "ncclAllReduce: count " + std::to_string(count) +
                                         " exceeds what one MPI call takes");
  if (count > 0 && (!send || !recv)) return fail(ncclInvalidArgument, "ncclAllReduce: null buffer");
  emu::stream_enqueue(
      stream,
      [=] {
        if (count) all_reduce_now(comm, send, recv, count, type, op);
      },
      "ncclAllReduce");
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t r = check_comm(comm, "ncclBroadcast"); r != ncclSuccess) return r;
  if (type_size(type) == 0)
    return fail(ncclInvalidArgument,
                "ncclBroadcast: data type " + std::to_string(type) + " is not emulated");
  if (root < 0 || root >= comm->size)
    return fail(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root) +
                                         " outside the " + std::to_string(comm->size) + " ranks");
  const size_t bytes = count * type_size(type);
  if (bytes > static_cast<size_t>(INT32_MAX))
    return fail(ncclInvalidArgument, "ncclBroadcast: " + std::to_string(bytes) + " bytes");
  emu::stream_enqueue(
      stream,
      [=] {
        if (!bytes) return;
        if (!emu::is_device_range(recv, bytes) ||
            (comm->rank == root && !emu::is_device_range(send, bytes)))
          throw emu::Fault{"[emu] nccl: ncclBroadcast: a buffer is not device memory"};
        if (comm->rank == root && send != recv) std::memcpy(recv, send, bytes);
        mpi_check(comm, MPI_Bcast(recv, static_cast<int>(bytes), MPI_BYTE, root, comm->mpi),
                  "MPI_Bcast");
      },
      "ncclBroadcast");
  return ncclSuccess;
}

}  // extern "C"
