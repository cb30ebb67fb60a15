// The tape and the reverse walk.
#include "engine/autograd.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "engine/error.h"

namespace engine {
namespace {

thread_local bool t_grad_enabled = true;

struct Tape {
  std::vector<std::weak_ptr<Node>> entries;  // in forward (sequence) order
  uint64_t next_sequence = 0;
  size_t live_after_compaction = 0;

  void compact() {
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [](const std::weak_ptr<Node>& w) {
                                   auto n = w.lock();
                                   return !n || n->released;
                                 }),
                  entries.end());
    live_after_compaction = entries.size();
  }
};

thread_local Tape t_tape;
thread_local LeafGradReadyHook t_leaf_hook;

// Over the nodes reachable from `root`: how many edges into each leaf they hold (for the leaf
// hook) and into each node (its consumers: a cast with one consumer can lend its leaf's .grad).
struct GraphCounts {
  std::unordered_map<const TensorImpl*, int> leaf_edges;
  std::unordered_map<const Node*, int> consumers;
};
GraphCounts count_edges(Node* root) {
  GraphCounts c;
  std::unordered_set<Node*> seen{root};
  std::vector<Node*> stack{root};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (e.leaf) ++c.leaf_edges[e.leaf.get()];
      if (e.node) ++c.consumers[e.node.get()];
      if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  return c;
}

TensorMeta meta_of(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }

// Sum of two gradients for the same tensor. In place into `a` when nothing else can see its
// values (its TensorImpl and its storage are held by the pending slot alone, contiguous): one
// pass instead of a copy and a pass (a residual stream's gradient is summed so twice a layer).
// Otherwise out of place, so no buffer a node still holds is changed. Same bits either way.
Tensor add_grads(Tensor& a, const Tensor& b) {
  if (a.impl_ptr().use_count() == 1 && a.storage().use_count() == 1 && a.is_contiguous() &&
      b.dtype() == a.dtype()) {
    a.add_(b);
    return std::move(a);
  }
  Tensor out = a.clone();
  out.add_(b);
  return out;
}

// The leaf behind input j of n when that input is a 16-bit cast (autocast's Tensor::to on the
// same device, not the CPU: its kernels compute in f32) of an f32 leaf and the cast has no other
// consumer: its .grad may take n's gradient in f32 directly (Node::grad_sink_f32), and the cast
// then never runs.
template <class Counts>
const std::shared_ptr<TensorImpl>* cast_leaf(const Node& n, size_t j, Counts& counts) {
  const std::shared_ptr<Node>& c = n.next[j].node;
  if (!c || std::strcmp(c->name(), "to") != 0 || c->next.size() != 1 || !c->next[0].leaf)
    return nullptr;
  const TensorMeta& out = n.inputs[j];
  const TensorMeta& in = c->inputs[0];
  if ((out.dtype != DType::bf16 && out.dtype != DType::f16) || in.dtype != DType::f32 ||
      in.device != out.device || out.device.is_cpu() || in.shape != out.shape)
    return nullptr;
  const auto& consumers = counts().consumers;
  auto it = consumers.find(c.get());
  return it != consumers.end() && it->second == 1 ? &c->next[0].leaf : nullptr;
}

using Pending = std::unordered_map<Node*, std::vector<Tensor>>;

// A sink offered for input i (grad_sinks or f32_sinks) and the leaf it belongs to.
const Tensor* sink_of(const std::vector<Tensor>& sinks, size_t i) {
  return i < sinks.size() && sinks[i].defined() ? &sinks[i] : nullptr;
}
TensorImpl* sink_leaf(const Node& n, size_t i) {
  return i < n.sink_leaves.size() ? n.sink_leaves[i] : nullptr;
}
// Add semantics: a deferred zero is zeroed. Write semantics: *overwrite says whether it was
// deferred, and the node now owns the write (the flag is cleared).
const Tensor* offer(const Node& n, const Tensor* sink, size_t i, bool* overwrite) {
  if (!sink) return nullptr;
  TensorImpl* leaf = sink_leaf(n, i);
  if (overwrite) {
    *overwrite = leaf && leaf->autograd.grad_fresh;
    if (leaf) leaf->autograd.grad_fresh = false;
  } else if (leaf) {
    materialize_grad(leaf);
  }
  return sink;
}

// g into a leaf's .grad: a copy the first time, or over a deferred zero (written, not added),
// else added in place.
void accumulate_leaf(AutogradMeta& am, const Tensor& g) {
  if (!am.grad.defined())
    am.grad = g.clone();
  else if (am.grad_fresh)
    am.grad.copy_(g);
  else
    am.grad.add_(g);
  am.grad_fresh = false;
}

// Offers node n, for its next backward() call, the .grad of each leaf input that can take the
// gradient in place, of each f32 leaf behind a 16-bit cast, and, on a device, the gradient
// already summed for a non-leaf input when nothing else holds it (see Node::grad_sink).
template <class Counts>
void offer_grad_sinks(Node& n, Counts& counts, Pending& pending) {
  n.grad_sinks.clear();
  n.f32_sinks.clear();
  n.sink_leaves.clear();
  auto owned_by = [&](size_t j, TensorImpl* leaf) {
    if (n.sink_leaves.empty()) n.sink_leaves.resize(n.next.size());
    // A leaf on two inputs of the node: its deferred zero made now (two writers would each
    // overwrite the other's part).
    for (TensorImpl* other : n.sink_leaves)
      if (other == leaf) materialize_grad(leaf);
    n.sink_leaves[j] = leaf;
  };
  auto usable = [](const Tensor& acc, const TensorMeta& m, DType dtype) {
    return acc.defined() && acc.is_contiguous() && acc.shape() == m.shape && acc.dtype() == dtype &&
           acc.device() == m.device;
  };
  for (size_t j = 0; j < n.next.size(); ++j) {
    const TensorMeta& m = n.inputs[j];
    if (const std::shared_ptr<TensorImpl>& leaf = n.next[j].leaf) {
      if (!usable(leaf->autograd.grad, m, m.dtype)) continue;
      if (n.grad_sinks.empty()) n.grad_sinks.resize(n.next.size());
      n.grad_sinks[j] = leaf->autograd.grad;
      owned_by(j, leaf.get());
    } else if (const std::shared_ptr<TensorImpl>* leaf = cast_leaf(n, j, counts)) {
      if (!usable((*leaf)->autograd.grad, m, DType::f32)) continue;
      if (n.f32_sinks.empty()) n.f32_sinks.resize(n.next.size());
      n.f32_sinks[j] = (*leaf)->autograd.grad;
      owned_by(j, leaf->get());
    } else if (const std::shared_ptr<Node>& producer = n.next[j].node;
               producer && !m.device.is_cpu()) {
      // The CPU keeps its bits: a GEMM adding into c sums in another order than c + (a b).
      auto it = pending.find(producer.get());
      if (it == pending.end()) continue;
      const Tensor& s = it->second[n.next[j].slot];
      if (!usable(s, m, m.dtype) || s.impl_ptr().use_count() != 1 || s.storage().use_count() != 1)
        continue;
      if (n.grad_sinks.empty()) n.grad_sinks.resize(n.next.size());
      n.grad_sinks[j] = s;
    }
  }
}

// Clears the offer when backward() returns or throws.
struct SinkScope {
  Node& n;
  template <class Counts>
  SinkScope(Node& node, Counts& counts, Pending& pending) : n(node) {
    offer_grad_sinks(n, counts, pending);
  }
  ~SinkScope() {
    n.grad_sinks.clear();
    n.f32_sinks.clear();
    n.sink_leaves.clear();
  }
  SinkScope(const SinkScope&) = delete;
  SinkScope& operator=(const SinkScope&) = delete;
};

}  // namespace

const Tensor* Node::grad_sink(size_t i, DType dtype) const {
  const Tensor* s = sink_of(grad_sinks, i);
  return s && s->dtype() == dtype ? offer(*this, s, i, nullptr) : nullptr;
}
const Tensor* Node::grad_sink(size_t i, DType dtype, bool* overwrite) const {
  const Tensor* s = sink_of(grad_sinks, i);
  return s && s->dtype() == dtype ? offer(*this, s, i, overwrite) : nullptr;
}
const Tensor* Node::grad_sink_f32(size_t i) const {
  return offer(*this, sink_of(f32_sinks, i), i, nullptr);
}
const Tensor* Node::grad_sink_f32(size_t i, bool* overwrite) const {
  return offer(*this, sink_of(f32_sinks, i), i, overwrite);
}

bool GradMode::is_enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool on) { t_grad_enabled = on; }

bool needs_grad(std::initializer_list<const Tensor*> ts) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : ts)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

void record(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
            const std::vector<Tensor>& outputs) {
  node->sequence_nr = t_tape.next_sequence++;
  node->next.clear();
  node->inputs.clear();
  for (const Tensor& in : inputs) {
    Edge e;
    TensorMeta m;
    if (in.defined()) {
      m = meta_of(in);
      const AutogradMeta& am = in.impl()->autograd;
      if (am.grad_fn) {
        e.node = am.grad_fn;
        e.slot = am.output_slot;
      } else if (am.requires_grad) {
        e.leaf = in.impl_ptr();
      }
    }
    node->next.push_back(std::move(e));
    node->inputs.push_back(std::move(m));
  }
  node->outputs.clear();
  for (size_t i = 0; i < outputs.size(); ++i) {
    AutogradMeta& am = outputs[i].impl()->autograd;
    am.requires_grad = true;
    am.grad_fn = node;
    am.output_slot = static_cast<int>(i);
    node->outputs.push_back(meta_of(outputs[i]));
  }
  t_tape.entries.push_back(node);
  // Graphs dropped without a backward leave expired entries; sweep them now and then.
  if (t_tape.entries.size() > 1024 && t_tape.entries.size() > 2 * t_tape.live_after_compaction)
    t_tape.compact();
}

LeafGradHookScope::LeafGradHookScope(LeafGradReadyHook hook) : prev_(std::move(t_leaf_hook)) {
  t_leaf_hook = std::move(hook);
}
LeafGradHookScope::~LeafGradHookScope() { t_leaf_hook = std::move(prev_); }

size_t tape_size() {
  t_tape.compact();
  return t_tape.entries.size();
}

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  ENGINE_CHECK(root.defined(), "[backward] called on an undefined tensor");
  ENGINE_CHECK(root.requires_grad(), "[backward] tensor ", describe(root),
               " does not require grad: no input of the ops that made it requires grad (or they "
               "ran under NoGrad)");
  Tensor seed = grad;
  if (!seed.defined()) {
    ENGINE_CHECK(root.numel() == 1, "[backward] root has shape ", shape_str(root.shape()),
                 ": pass a gradient of that shape, or call backward on a one-element tensor");
    seed = Tensor::ones(root.shape(), root.dtype(), root.device());
  } else {
    ENGINE_CHECK(seed.shape() == root.shape(), "[backward] gradient shape ",
                 shape_str(seed.shape()), " does not match root shape ", shape_str(root.shape()));
  }

  NoGrad no_grad;  // backward formulas are not themselves recorded
  const AutogradMeta& rm = root.impl()->autograd;
  if (!rm.grad_fn) {  // the root is a leaf
    Tensor g = seed.to(root.dtype()).to(root.device());
    accumulate_leaf(root.impl()->autograd, g);
    if (t_leaf_hook) t_leaf_hook(root.impl());
    return;
  }

  Pending pending;
  Node* root_node = rm.grad_fn.get();
  auto freed = [](const Node* n) {
    ENGINE_FAIL("[backward] the graph through '", n->name(),
                "' was already freed by an earlier "
                "backward; pass retain_graph = true to the first backward to run it twice");
  };
  if (root_node->released) freed(root_node);
  pending[root_node].resize(root_node->outputs.size());
  pending[root_node][rm.output_slot] = seed;
  const uint64_t root_seq = root_node->sequence_nr;
  // The graph's edge counts, taken when the leaf hook or a cast's f32 sink first needs them (a
  // walk over the graph; a CPU step never needs it without a hook).
  GraphCounts counts;
  bool counted = false;
  auto graph_counts = [&]() -> GraphCounts& {
    if (!counted) counts = count_edges(root_node), counted = true;
    return counts;
  };
  if (t_leaf_hook) graph_counts();
  std::unordered_map<const TensorImpl*, int>& leaf_edges = counts.leaf_edges;
  // A leaf's edge is done: the hook fires when its last one is.
  auto leaf_edge_done = [&](const std::shared_ptr<TensorImpl>& leaf) {
    auto c = leaf_edges.find(leaf.get());
    if (c != leaf_edges.end() && --c->second == 0) {
      leaf_edges.erase(c);
      materialize_grad(leaf.get());  // complete: a deferred zero nothing wrote is a zero
      t_leaf_hook(leaf.get());
    }
  };

  std::vector<std::shared_ptr<Node>> ran;
  auto& entries = t_tape.entries;
  for (size_t idx = entries.size(); idx-- > 0 && !pending.empty();) {
    std::shared_ptr<Node> node = entries[idx].lock();
    if (!node || node->sequence_nr > root_seq) continue;
    auto it = pending.find(node.get());
    if (it == pending.end()) continue;
    if (node->released) freed(node.get());
    std::vector<Tensor> grad_outputs = std::move(it->second);
    pending.erase(it);
    std::vector<Tensor> grad_inputs;
    std::vector<bool> through_cast;  // input j's gradient went into the leaf behind its cast
    {
      SinkScope sinks(*node, graph_counts, pending);
      grad_inputs = node->backward(grad_outputs);
      for (size_t j = 0; j < node->f32_sinks.size() && j < grad_inputs.size(); ++j)
        if (node->f32_sinks[j].defined() && !grad_inputs[j].defined()) {
          if (through_cast.empty()) through_cast.resize(grad_inputs.size());
          through_cast[j] = true;
        }
    }
    ENGINE_CHECK(grad_inputs.size() == node->next.size(), "[backward] node '", node->name(),
                 "' returned ", grad_inputs.size(), " gradients for ", node->next.size(),
                 " inputs");
    for (size_t j = 0; j < grad_inputs.size(); ++j) {
      const Edge& e = node->next[j];
      Tensor& g = grad_inputs[j];
      if (!e.valid() || !g.defined()) continue;
      const TensorMeta& m = node->inputs[j];
      ENGINE_CHECK(g.shape() == m.shape, "[backward] node '", node->name(),
                   "' returned a gradient of shape ", shape_str(g.shape()), " for input ", j,
                   " of shape ", shape_str(m.shape));
      if (g.dtype() != m.dtype) g = g.to(m.dtype);
      if (e.node) {
        std::vector<Tensor>& slots = pending[e.node.get()];
        if (slots.empty()) slots.resize(e.node->outputs.size());
        Tensor& s = slots[e.slot];
        s = s.defined() ? add_grads(s, g) : g;
      } else {
        accumulate_leaf(e.leaf->autograd, g);
      }
    }
    if (t_leaf_hook) {
      for (size_t j = 0; j < node->next.size(); ++j) {
        const Edge& e = node->next[j];
        if (e.leaf) leaf_edge_done(e.leaf);
        // The cast whose only consumer wrote through it will not run: its leaf edge is done.
        if (j < through_cast.size() && through_cast[j]) leaf_edge_done(e.node->next[0].leaf);
      }
    }
    if (!retain_graph) ran.push_back(node);
  }
  // Nodes still waiting were not on this thread's tape: freed earlier (and swept), or recorded
  // by another thread.
  for (auto& [n, g] : pending) {
    if (n->released) freed(n);
    ENGINE_FAIL("[backward] node '", n->name(),
                "' is not on this thread's tape (was the graph "
                "recorded on another thread?)");
  }
  // Leaves behind nodes that never received a gradient: complete too, now.
  if (t_leaf_hook)
    for (auto& [leaf, count] : leaf_edges) {
      materialize_grad(const_cast<TensorImpl*>(leaf));
      t_leaf_hook(leaf);
    }
  for (auto& n : ran) {
    n->release_saved();
    n->released = true;
  }
  if (!retain_graph) t_tape.compact();
}

}  // namespace engine
