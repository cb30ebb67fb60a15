// Reverse-mode autograd. An op that sees an input requiring grad (with grad mode on) records a
// Node on the thread's tape: a vector appended in forward order. backward() walks the tape in
// reverse from the root's node, calling each node that received a gradient and routing its input
// gradients to producer nodes (summed when a tensor feeds several ops) or into leaves' .grad.
//
// Nodes are owned by the tensors they produced (and by the nodes downstream of them), so a graph
// that is dropped without a backward frees itself; the tape holds weak references only.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "engine/tensor.h"

namespace engine {

// Grad mode is per thread. While off, no op records.
class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool on);
};

// RAII: disables recording in a scope (optimizer steps, evaluation, backward itself).
class NoGrad {
 public:
  NoGrad() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGrad() { GradMode::set_enabled(prev_); }
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool prev_;
};

// Where an input's gradient goes: into a producer node's output slot, or into a leaf.
struct Edge {
  std::shared_ptr<Node> node;
  int slot = 0;
  std::shared_ptr<TensorImpl> leaf;
  bool valid() const { return node != nullptr || leaf != nullptr; }
};

struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

class Node {
 public:
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  // grad_outputs[i] is the gradient of output i, undefined if none reached it. Returns one entry
  // per input: the gradient, or an undefined Tensor where needs_input_grad(i) is false or where
  // backward() added the gradient into grad_sink(i) itself.
  virtual std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) = 0;
  // Drops saved tensors once a backward without retain_graph has used them.
  virtual void release_saved() {}

  bool needs_input_grad(size_t i) const { return i < next.size() && next[i].valid(); }

  // Where backward() may add input i's gradient itself, or nullptr. For the duration of one
  // backward() call, run_backward offers the .grad of each leaf input that already holds one
  // (contiguous, of the input's shape, dtype and device; a leaf on two inputs gets it on both, and
  // each add lands), and, for a non-leaf input on a device, the gradient other consumers of it have
  // already passed back when nothing else holds that tensor (a residual stream's: the residual
  // join's part, which the sublayer's input GEMM then adds to): a node may add its gradient into
  // it in place (a GEMM with beta 1, a scatter-add) and return an undefined gradient for i,
  // instead of a new tensor the engine would add with a second pass over memory. `dtype` is the
  // gradient's: a sink only for the input's. A leaf's .grad whose zero was deferred
  // (AutogradMeta::grad_fresh) is zeroed here first, so adding into it is right.
  const Tensor* grad_sink(size_t i, DType dtype) const;
  // The same for a node that puts its whole gradient for input i into the sink: *overwrite is
  // set when the sink is a leaf's .grad with a deferred zero (its values stale, meaning 0): the
  // node then writes its gradient (a GEMM with beta 0, a kernel storing instead of adding) and
  // must not read the sink; otherwise it adds. Asking commits the node to writing it.
  const Tensor* grad_sink(size_t i, DType dtype, bool* overwrite) const;
  // For a bf16 / f16 input i on a device that is autocast's cast of an f32 leaf (Tensor::to on
  // the same device) used by this node alone: the leaf's f32 .grad, where backward() may add the
  // gradient in f32 itself (a 16-bit GEMM storing f32 with beta 1) and return an undefined
  // gradient for i; the cast then never runs (no 16-bit gradient, no conversion, no separate
  // add into the slab). nullptr otherwise. A deferred zero is zeroed first, as above.
  const Tensor* grad_sink_f32(size_t i) const;
  // The same with *overwrite as for grad_sink's second form.
  const Tensor* grad_sink_f32(size_t i, bool* overwrite) const;

  uint64_t sequence_nr = 0;
  std::vector<Edge> next;          // one per input
  std::vector<TensorMeta> inputs;  // shapes the returned gradients must have
  std::vector<TensorMeta> outputs;
  std::vector<Tensor> grad_sinks;        // set by run_backward around backward(); see grad_sink
  std::vector<Tensor> f32_sinks;         // likewise; see grad_sink_f32
  std::vector<TensorImpl*> sink_leaves;  // the leaf whose .grad each offered sink is, or null
  bool released = false;
};

// True when grad mode is on and any defined tensor among `ts` requires grad.
bool needs_grad(std::initializer_list<const Tensor*> ts);
inline bool needs_grad(const Tensor& a) { return needs_grad({&a}); }
inline bool needs_grad(const Tensor& a, const Tensor& b) { return needs_grad({&a, &b}); }
inline bool needs_grad(const Tensor& a, const Tensor& b, const Tensor& c) {
  return needs_grad({&a, &b, &c});
}

// Wires `node` into the graph: edges from `inputs` (undefined ones get none), outputs marked as
// produced by it, node appended to the tape.
void record(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
            const std::vector<Tensor>& outputs);

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

// Told, during a backward on this thread, when a leaf's gradient is complete for that backward:
// every node of the backward with an edge into the leaf has run, so nothing more will be added to
// its .grad. Each leaf the backward reaches is reported once (leaves whose producers received no
// gradient are reported when the walk ends). Data-parallel training starts a bucket's all-reduce
// from here while the rest of backward runs. One hook per thread, installed for a scope.
using LeafGradReadyHook = std::function<void(const TensorImpl* leaf)>;
class LeafGradHookScope {
 public:
  explicit LeafGradHookScope(LeafGradReadyHook hook);
  ~LeafGradHookScope();
  LeafGradHookScope(const LeafGradHookScope&) = delete;
  LeafGradHookScope& operator=(const LeafGradHookScope&) = delete;

 private:
  LeafGradReadyHook prev_;
};

// Live entries on this thread's tape (for tests: no-grad code must not grow it).
size_t tape_size();

}  // namespace engine
