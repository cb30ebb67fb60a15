// Recording the device work of a stretch of code, for the GPU performance model
// (docs/performance-model.md). While recording is on, every kernel-table call (engine/kernel.h)
// and every backend layout call on a device appends one WorkRecord: the op, the shapes of its
// tensor arguments, the minimum bytes it must move (every distinct element of every tensor
// argument read or written once; a stride-0 broadcast view counts its stored elements only), its
// FLOPs (GEMMs: 2 m n k per batch entry; other ops 0: they are bandwidth-bound) and the kernel
// launches and GEMMs it made. Off by default; the check is one relaxed atomic load.
//
//   engine::start_work_recording();
//   trainer.step(...);
//   for (const engine::WorkRecord& r : engine::stop_work_recording()) ...
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace engine {

class Tensor;

// One kernel launch (or library GEMM) of a record: what the performance model times.
struct LaunchRecord {
  std::string kernel;   // the launched kernel ("sum_to_columns", ...; "cublasLtMatmul")
  int64_t blocks = 0;   // grid size, all dims (0 for a library GEMM)
  int64_t threads = 0;  // threads per block, all dims
};

struct WorkRecord {
  std::string op;                     // the kernel table's name ("gemm", "layer_norm", "copy", ...)
  std::string shape;                  // the tensor arguments: "(8, 128, 768) bf16 (768) f32 ..."
  double bytes = 0;                   // minimum bytes moved
  double flops = 0;                   // arithmetic (GEMMs)
  int64_t launches = 0;               // kernels launched while the op ran
  int64_t gemms = 0;                  // library GEMMs (cuBLASLt) while the op ran
  std::vector<LaunchRecord> kernels;  // each launch and GEMM, in order
};

bool work_recording();
void start_work_recording();
std::vector<WorkRecord> stop_work_recording();  // the records since start, in order

// What a kernel-table argument contributes to its record (found by ADL, so an op's own argument
// type can add an overload: ops/matmul.h does for GemmArgs).
struct WorkCost {
  double bytes = 0, flops = 0;
  std::string shape;
};
void add_work_cost(WorkCost& cost, const Tensor& t);
template <class T>
void add_work_cost(WorkCost&, const T&) {}  // scalars, options: nothing

// Opens a record for the scope (nested scopes add to the outermost one: an op's own sub-calls
// are part of it).
class WorkScope {
 public:
  WorkScope(const char* op, const WorkCost& cost);
  ~WorkScope();
  WorkScope(const WorkScope&) = delete;
  WorkScope& operator=(const WorkScope&) = delete;

 private:
  bool counted_ = false;  // this scope raised the thread's depth
};

// Called by the CUDA layer for each kernel launch / library GEMM: counted in the open record
// (a launch outside any scope gets a record of its own, named after the kernel), with its shape.
void note_work_launch(const char* kernel, bool gemm, int64_t blocks, int64_t threads);

}  // namespace engine
