// The communicators of engine/comm.h: the single-process one, and MPI (+ NCCL for CUDA tensors)
// with its watchdog.
#include "engine/comm.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <Eigen/Core>

#include "engine/error.h"
#include "engine/threads.h"

#if defined(ENGINE_WITH_MPI)
#include <mpi.h>
#endif
#if defined(ENGINE_WITH_NCCL)
#include <cuda_runtime.h>

#include "engine/cuda/nccl.h"
#endif

namespace engine {
namespace {

class DoneWork final : public CommWork {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend(Device) const override { return "single"; }
  std::unique_ptr<CommWork> all_reduce_async(const Tensor&, ReduceOp) override {
    return std::make_unique<DoneWork>();
  }
  void broadcast(const Tensor&, int root) override {
    ENGINE_CHECK(root == 0, "[comm] broadcast from rank ", root, " in a single-process job");
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

SingleProcess g_single;
Communicator* g_world = &g_single;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

#if defined(ENGINE_WITH_MPI)

double comm_timeout_s() {
  const char* v = env("ENGINE_COMM_TIMEOUT_S");
  if (!v) return 600.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  ENGINE_CHECK(end && *end == '\0' && s > 0, "[comm] ENGINE_COMM_TIMEOUT_S=", v,
               ": expected a positive number of seconds");
  return s;
}

MPI_Datatype mpi_type(DType t, const char* what) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::bf16:
      return MPI_FLOAT;  // MPI has no bf16: reduced in f32, rounded once (all_reduce_now)
    default:
      ENGINE_FAIL("[comm] ", what, " of a ", dtype_name(t),
                  " CPU tensor: MPI reduces f32, f64, bf16 (in f32), i32, i64 and u8 (convert "
                  "first)");
  }
}

// The CPU backend's bf16 conversions (Eigen's: round to nearest even), on raw bits.
float bf16_bits_to_float(uint16_t b) {
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(b));
}
uint16_t float_to_bf16_bits(float f) {
  return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(f));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    default:
      return MPI_SUM;  // avg = sum, then divide
  }
}

constexpr int64_t kChunk = int64_t(1) << 30;  // MPI counts are ints

class MpiCommunicator;

// Blocking waits register here so the watchdog can see how long they have been waiting.
struct WaitGuard {
  WaitGuard(MpiCommunicator& c, const char* what);
  ~WaitGuard();
  MpiCommunicator& comm;
};

// An all-reduce queued to the communication thread.
class MpiWork final : public CommWork {
 public:
  MpiWork(MpiCommunicator& comm, Tensor t, ReduceOp op) : comm_(comm), t_(std::move(t)), op_(op) {}
  ~MpiWork() override;
  void wait() override;
  bool test() override { return done.load(); }
  void run();  // on the communication thread

  std::atomic<bool> done{false};
  std::string error;  // set before done

 private:
  MpiCommunicator& comm_;
  Tensor t_;
  ReduceOp op_;
  bool finished_ = false;
};

// Gradient buckets are reduced by a communication thread with blocking MPI_Allreduce (the only
// way to make progress while the main thread computes: MPI's non-blocking collectives advance
// only inside MPI calls). MPI is initialised SERIALIZED: the main thread's own collectives wait
// until that thread is idle, so two threads never call MPI at once.
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(bool threaded) : timeout_s_(comm_timeout_s()) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    // Errors come back as codes (turned into engine::Error) instead of MPI's default abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_dup(MPI_COMM_WORLD, &fail_comm_);  // all_failing's barrier, apart from the work
    watchdog_ = std::thread([this] { watch(); });
    if (threaded) worker_ = std::thread([this] { work_loop(); });
  }
  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    queue_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (worker_.joinable()) worker_.join();
    MPI_Comm_free(&fail_comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend(Device d) const override {
#if defined(ENGINE_WITH_NCCL)
    if (d.is_cuda()) return "mpi+nccl";
#endif
    return "mpi";
  }

  std::unique_ptr<CommWork> all_reduce_async(const Tensor& t, ReduceOp op) override {
    if (t.device().is_cuda()) return nccl().all_reduce_async(t, op);
    ENGINE_CHECK(t.is_contiguous(), "[comm] all_reduce needs a contiguous tensor");
    ENGINE_CHECK(op != ReduceOp::avg || is_floating(t.dtype()),
                 "[comm] all_reduce avg of an integer tensor");
    ENGINE_CHECK(op != ReduceOp::avg || t.dtype() != DType::bf16,
                 "[comm] all_reduce avg of a bf16 CPU tensor: reduce with sum and scale");
    mpi_type(t.dtype(), "all_reduce");  // checked here, on the caller's thread
    auto work = std::make_unique<MpiWork>(*this, t, op);
    if (!worker_.joinable()) {
      work->run();
    } else {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_.push_back(work.get());
    }
    queue_cv_.notify_all();
    return work;
  }

  // Blocking all-reduce of `t` in chunks (the communication thread, or inline).
  void all_reduce_now(const Tensor& t, ReduceOp op) {
    const MPI_Datatype type = mpi_type(t.dtype(), "all_reduce");
    if (t.dtype() == DType::bf16) {
      // Widened to f32, reduced, rounded to bf16 once (what NCCL's bf16 sum of two ranks gives;
      // more ranks round once here, once per hop there). Plain bit arithmetic: this runs on the
      // communication thread, which launches no tensor ops.
      uint16_t* p = static_cast<uint16_t*>(t.raw_data());
      std::vector<float> wide(static_cast<size_t>(std::min(kChunk, t.numel())));
      for (int64_t at = 0; at < t.numel(); at += kChunk) {
        const int n = static_cast<int>(std::min(kChunk, t.numel() - at));
        for (int i = 0; i < n; ++i) wide[size_t(i)] = bf16_bits_to_float(p[at + i]);
        check(MPI_Allreduce(MPI_IN_PLACE, wide.data(), n, MPI_FLOAT, mpi_op(op), MPI_COMM_WORLD),
              "MPI_Allreduce");
        for (int i = 0; i < n; ++i) p[at + i] = float_to_bf16_bits(wide[size_t(i)]);
      }
      return;
    }
    char* p = static_cast<char*>(t.raw_data());
    const size_t esize = dtype_size(t.dtype());
    for (int64_t at = 0; at < t.numel(); at += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, t.numel() - at));
      check(MPI_Allreduce(MPI_IN_PLACE, p + at * esize, n, type, mpi_op(op), MPI_COMM_WORLD),
            "MPI_Allreduce");
    }
  }

  // Blocks until the communication thread has nothing queued or running.
  void drain() {
    std::unique_lock<std::mutex> lock(queue_mu_);
    queue_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }
  std::mutex& queue_mutex() { return queue_mu_; }
  std::condition_variable& queue_cv() { return queue_cv_; }

  void broadcast(const Tensor& t, int root) override {
    ENGINE_CHECK(root >= 0 && root < size_, "[comm] broadcast from rank ", root, " of ", size_);
    if (t.device().is_cuda()) return nccl().broadcast(t, root);
    ENGINE_CHECK(t.is_contiguous(), "[comm] broadcast needs a contiguous tensor");
    broadcast_bytes(t.raw_data(), t.nbytes(), root);
  }

  void barrier() override {
    WaitGuard g(*this, "barrier");
    drain();
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  }

  bool all_failing(double timeout_s) override {
    {  // MPI is SERIALIZED: only when the communication thread is idle may this thread call it.
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (busy_ || !queue_.empty()) return false;
    }
    MPI_Request req;
    if (MPI_Ibarrier(fail_comm_, &req) != MPI_SUCCESS) return false;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return done != 0;
  }

  [[noreturn]] void abort(int code) override {
#if defined(ENGINE_WITH_NCCL)
    if (nccl_) nccl_->abort();
#endif
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

  void broadcast_bytes(void* data, size_t nbytes, int root) {
    WaitGuard g(*this, "broadcast");
    drain();
    char* p = static_cast<char*>(data);
    for (size_t at = 0; at < nbytes; at += size_t(kChunk)) {
      const int n = static_cast<int>(std::min<size_t>(size_t(kChunk), nbytes - at));
      check(MPI_Bcast(p + at, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

  void check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    ENGINE_FAIL("[comm] rank ", rank_, ": ", call, " failed: ", std::string(text, size_t(len)));
  }

  // The watchdog's view of the one blocking wait at a time (the main thread's).
  void begin_wait(const char* what) {
    what_.store(what);
    since_ms_.store(now_ms());
  }
  void end_wait() { since_ms_.store(0); }

 private:
  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

#if defined(ENGINE_WITH_NCCL)
  cuda::NcclChannel& nccl() {
    if (!nccl_) {
      int devices = 0;
      ENGINE_CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0, "[comm] rank ",
                   rank_, ": a CUDA collective, but no GPU is visible");
      nccl_ = cuda::NcclChannel::create(rank_, size_, local_rank_ % devices,
                                        [this](void* p, size_t n) { broadcast_bytes(p, n, 0); });
    }
    return *nccl_;
  }
  std::unique_ptr<cuda::NcclChannel> nccl_;
#else
  struct NoNccl {
    std::unique_ptr<CommWork> all_reduce_async(const Tensor&, ReduceOp) { fail(); }
    void broadcast(const Tensor&, int) { fail(); }
    [[noreturn]] void fail() { ENGINE_FAIL("[comm] a CUDA tensor, but this build has no NCCL"); }
  } no_nccl_;
  NoNccl& nccl() { return no_nccl_; }
#endif

  // Once a second: a wait past the timeout, or an NCCL error, ends the job. std::_Exit rather
  // than MPI calls from this thread (MPI runs single-threaded here); the launcher sees the rank
  // die and ends the others.
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; })) {
      const int64_t since = since_ms_.load();
      std::string problem;
      if (since != 0 && double(now_ms() - since) / 1000.0 > timeout_s_) {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "%s has waited %.0f s for the other ranks (ENGINE_COMM_TIMEOUT_S=%g)",
                      what_.load(), double(now_ms() - since) / 1000.0, timeout_s_);
        problem = buf;
      }
#if defined(ENGINE_WITH_NCCL)
      if (problem.empty() && nccl_) {
        const std::string e = nccl_->async_error();
        if (!e.empty()) problem = "NCCL reported an asynchronous error: " + e;
      }
#endif
      if (!problem.empty()) {
        std::fprintf(stderr, "[rank %d/%d] %s; ending the job\n", rank_, size_, problem.c_str());
        std::fflush(stderr);
        std::fflush(stdout);
        std::_Exit(124);
      }
    }
  }

  void work_loop() {
    std::unique_lock<std::mutex> lock(queue_mu_);
    for (;;) {
      queue_cv_.wait(lock, [this] { return stop_worker() || !queue_.empty(); });
      if (queue_.empty()) return;
      MpiWork* w = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      w->run();
      lock.lock();
      busy_ = false;
      queue_cv_.notify_all();
    }
  }
  bool stop_worker() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  double timeout_s_;
  std::atomic<const char*> what_{""};
  std::atomic<int64_t> since_ms_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread watchdog_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<MpiWork*> queue_;  // owned by their callers, who wait before dropping them
  bool busy_ = false;
  std::thread worker_;
  MPI_Comm fail_comm_ = MPI_COMM_NULL;
};

WaitGuard::WaitGuard(MpiCommunicator& c, const char* what) : comm(c) { comm.begin_wait(what); }
WaitGuard::~WaitGuard() { comm.end_wait(); }

MpiWork::~MpiWork() {
  if (!finished_) {
    try {
      wait();
    } catch (...) {
    }
  }
}

void MpiWork::run() {
  try {
    comm_.all_reduce_now(t_, op_);
  } catch (const std::exception& e) {
    error = e.what();
  }
  done.store(true);
}

void MpiWork::wait() {
  if (finished_) return;
  finished_ = true;
  {
    WaitGuard g(comm_, "all_reduce");
    std::unique_lock<std::mutex> lock(comm_.queue_mutex());
    comm_.queue_cv().wait(lock, [this] { return done.load(); });
  }
  ENGINE_CHECK(error.empty(), error);
  if (op_ != ReduceOp::avg) return;
  const double inv = 1.0 / double(comm_.size());
  if (t_.dtype() == DType::f32) {
    float* p = t_.data<float>();
    for (int64_t i = 0; i < t_.numel(); ++i) p[i] = float(double(p[i]) * inv);
  } else {
    double* p = t_.data<double>();
    for (int64_t i = 0; i < t_.numel(); ++i) p[i] *= inv;
  }
}

std::unique_ptr<MpiCommunicator> g_mpi;

#endif  // ENGINE_WITH_MPI

}  // namespace

void Communicator::all_reduce(std::span<double> values, ReduceOp op) {
  if (size() == 1 || values.empty()) return;
  // Host values in a host tensor: no transfer of device data (transfer_counts() stays put).
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::f64);
  std::copy(values.begin(), values.end(), t.data<double>());
  all_reduce(t, op);
  const double* p = t.data<double>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = p[i];
}

double Communicator::all_reduce(double value, ReduceOp op) {
  all_reduce(std::span<double>(&value, 1), op);
  return value;
}

std::string Communicator::broadcast(const std::string& text, int root) {
  if (size() == 1) return text;
  Tensor n = Tensor::from_vector<int64_t>({static_cast<int64_t>(text.size())}, {1});
  broadcast(n, root);
  const int64_t len = n.to_vector<int64_t>()[0];
  Tensor bytes = Tensor::zeros({len}, DType::u8);
  if (rank() == root) std::copy(text.begin(), text.end(), bytes.data<uint8_t>());
  broadcast(bytes, root);
  const uint8_t* p = bytes.data<uint8_t>();
  return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
}

Communicator& world() { return *g_world; }

bool launched_by_mpi() {
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (env(name)) return true;
  return false;
}

DistributedSession::DistributedSession() {
  start();
  // The ranks on one node share its cores (engine/threads.h).
  configure_cpu_threads(world().local_size());
}

void DistributedSession::start() {
  if (!launched_by_mpi()) return;
#if defined(ENGINE_WITH_MPI)
  int initialized = 0;
  MPI_Initialized(&initialized);
  ENGINE_CHECK(!initialized && !g_mpi,
               "[comm] DistributedSession: MPI is already initialised (one session per process)");
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  g_mpi = std::make_unique<MpiCommunicator>(provided >= MPI_THREAD_SERIALIZED);
  g_world = g_mpi.get();
#else
  const char* n = env("OMPI_COMM_WORLD_SIZE") ? env("OMPI_COMM_WORLD_SIZE") : env("PMI_SIZE");
  ENGINE_CHECK(
      !n || std::string(n) == "1", "[comm] started by an MPI launcher with ", n,
      " processes, but this build of libengine has no MPI (install libopenmpi-dev and rebuild)");
#endif
}

DistributedSession::~DistributedSession() {
#if defined(ENGINE_WITH_MPI)
  if (!g_mpi) return;
  g_world = &g_single;
  g_mpi.reset();
  MPI_Finalize();
#endif
}

int fail_job(const char* app, const std::string& message, int code) {
  Communicator& c = world();
  if (c.size() > 1) {
    const char* t = std::getenv("ENGINE_FAIL_AGREE_S");
    const double timeout = t ? std::atof(t) : 10.0;
    if (c.all_failing(timeout)) {
      if (c.rank() != 0) return 0;
      std::fprintf(stderr, "%s: [all %d ranks] %s\n", app, c.size(), message.c_str());
      std::fflush(stderr);
      return code;
    }
    std::fprintf(stderr, "%s: [rank %d/%d] %s\n", app, c.rank(), c.size(), message.c_str());
    std::fflush(stderr);
    c.abort(code);
  }
  std::fprintf(stderr, "%s: %s\n", app, message.c_str());
  return code;
}

int run_job(const char* app, const std::function<int()>& body) {
  try {
    DistributedSession session;
    try {
      return body();
    } catch (const Error& e) {
      // In a multi-rank job this ends every rank (the others may wait in a collective).
      return fail_job(app, e.what(), e.exit_code());
    } catch (const std::exception& e) {
      return fail_job(app, std::string("unexpected error: ") + e.what(), 1);
    }
  } catch (const std::exception& e) {  // MPI could not start
    std::fprintf(stderr, "%s: %s\n", app, e.what());
    return 1;
  }
}

}  // namespace engine
