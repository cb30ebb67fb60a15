// Collective communication between the processes of a job: MPI launches and bootstraps them,
// CPU tensors travel through MPI and CUDA tensors through NCCL (its unique id broadcast over MPI,
// one GPU per local rank). Without MPI in the build, or when the process was not started by an
// MPI launcher, the communicator is the single-process one: every collective is the identity.
//
//   int main(int argc, char** argv) {
//     engine::DistributedSession session;        // MPI_Init when started by mpirun
//     engine::Communicator& comm = engine::world();
//     ...
//     comm.all_reduce(grads, engine::ReduceOp::sum);
//   }
//
// Collectives are blocking unless named _async; every rank must call the same collectives in the
// same order with tensors of the same shape and dtype. A watchdog thread ends the whole job when a
// collective waits longer than the timeout (ENGINE_COMM_TIMEOUT_S, default 600 s) or NCCL reports
// an asynchronous error, printing which rank and which collective; a rank that dies is noticed by
// the launcher, which ends the others.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "engine/tensor.h"

namespace engine {

enum class ReduceOp { sum, avg, max, min };

// A collective in flight.
class CommWork {
 public:
  virtual ~CommWork() = default;
  virtual void wait() = 0;  // blocks until done (CUDA: makes the current stream wait for it)
  virtual bool test() = 0;  // true once done, without blocking
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the ranks on this node
  virtual int local_size() const = 0;
  bool is_root() const { return rank() == 0; }
  // "single", "mpi" or "mpi+nccl": what moves tensors on `device`.
  virtual std::string backend(Device device) const = 0;

  // In place on a contiguous tensor (f32, f64, bf16 on CUDA, i32, i64). avg divides by size().
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum) { all_reduce_async(t, op)->wait(); }
  virtual std::unique_ptr<CommWork> all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  // In place: every rank ends with root's values.
  virtual void broadcast(const Tensor& t, int root = 0) = 0;
  virtual void barrier() = 0;
  // Ends every process of the job with `code` (MPI_Abort); prints nothing itself.
  [[noreturn]] virtual void abort(int code) = 0;
  // Called by a rank that is failing: true when every rank of the job fails too, within
  // `timeout_s` (each calls this; a deterministic error such as a bad flag or config key fails
  // everywhere), false when the others are elsewhere (e.g. waiting in a collective) or this rank
  // cannot tell. One process: true.
  virtual bool all_failing(double timeout_s) { return size() == 1; }

  // Built on the above.
  void all_reduce(std::span<double> values, ReduceOp op = ReduceOp::sum);
  double all_reduce(double value, ReduceOp op = ReduceOp::sum);
  std::string broadcast(const std::string& text, int root = 0);
};

// The job's communicator (the single-process one until DistributedSession starts MPI).
Communicator& world();

// True when an MPI launcher (mpirun/mpiexec, srun with PMI/PMIx) started this process.
bool launched_by_mpi();

// Starts MPI for the process when it was launched by an MPI launcher (and the build has MPI),
// making world() the MPI communicator; finalises it on destruction. One per process, in main.
// It also sets the CPU threads per rank (engine/threads.h: the node's cores / its local ranks).
// Under a launcher in a build without MPI it fails with a clear message rather than running N
// unrelated copies of the job.
class DistributedSession {
 public:
  DistributedSession();
  ~DistributedSession();
  DistributedSession(const DistributedSession&) = delete;
  DistributedSession& operator=(const DistributedSession&) = delete;

 private:
  void start();
};

// Reports an error that ends the program: "<app>: <message>" on stderr, and returns `code` for
// main to return. In a multi-process job the message is printed once: when every rank fails
// (Communicator::all_failing within ENGINE_FAIL_AGREE_S seconds, default 10) rank 0 prints
// "<app>: [all N ranks] <message>" and returns `code`, the other ranks return 0, and MPI ends
// normally (no MPI_Abort); otherwise the failing rank prints "<app>: [rank r/N] <message>" and
// aborts the job (the others may be blocked in a collective) without returning.
int fail_job(const char* app, const std::string& message, int code);

// The body of an app's main() that may run under mpirun: starts the DistributedSession, runs
// `body`, and turns an exception into one message and exit status 1 through fail_job
// ("unexpected error: " before anything that is not an engine::Error). A failure to start MPI is
// reported on stderr and returns 1.
int run_job(const char* app, const std::function<int()>& body);

}  // namespace engine
