// The tape and the reverse walk.
#include "engine/autograd.h"

#include <algorithm>
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

// For the leaf hook: how many edges into each leaf the nodes reachable from `root` hold.
std::unordered_map<const TensorImpl*, int> count_leaf_edges(Node* root) {
  std::unordered_map<const TensorImpl*, int> counts;
  std::unordered_set<Node*> seen{root};
  std::vector<Node*> stack{root};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (e.leaf) ++counts[e.leaf.get()];
      if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  return counts;
}

TensorMeta meta_of(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }

// Sum of two gradients for the same tensor; out of place so no pending buffer is aliased.
Tensor add_grads(const Tensor& a, const Tensor& b) {
  Tensor out = a.clone();
  out.add_(b);
  return out;
}

// Offers node n, for its next backward() call, the .grad of each leaf input that can take the
// gradient in place (see Node::grad_sink).
void offer_grad_sinks(Node& n) {
  n.grad_sinks.clear();
  for (size_t j = 0; j < n.next.size(); ++j) {
    const std::shared_ptr<TensorImpl>& leaf = n.next[j].leaf;
    if (!leaf) continue;
    const Tensor& acc = leaf->autograd.grad;
    const TensorMeta& m = n.inputs[j];
    if (!acc.defined() || !acc.is_contiguous() || acc.shape() != m.shape ||
        acc.dtype() != m.dtype || acc.device() != m.device)
      continue;
    if (n.grad_sinks.empty()) n.grad_sinks.resize(n.next.size());
    n.grad_sinks[j] = acc;
  }
}

// Clears the offer when backward() returns or throws.
struct SinkScope {
  Node& n;
  explicit SinkScope(Node& node) : n(node) { offer_grad_sinks(n); }
  ~SinkScope() { n.grad_sinks.clear(); }
  SinkScope(const SinkScope&) = delete;
  SinkScope& operator=(const SinkScope&) = delete;
};

}  // namespace

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
    Tensor& acc = root.impl()->autograd.grad;
    if (acc.defined())
      acc.add_(g);
    else
      acc = g.clone();
    if (t_leaf_hook) t_leaf_hook(root.impl());
    return;
  }

  std::unordered_map<Node*, std::vector<Tensor>> pending;
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
  std::unordered_map<const TensorImpl*, int> leaf_edges;
  if (t_leaf_hook) leaf_edges = count_leaf_edges(root_node);

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
    {
      SinkScope sinks(*node);
      grad_inputs = node->backward(grad_outputs);
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
        Tensor& acc = e.leaf->autograd.grad;
        if (acc.defined())
          acc.add_(g);
        else
          acc = g.clone();
      }
    }
    if (t_leaf_hook) {
      for (const Edge& e : node->next) {
        if (!e.leaf) continue;
        auto c = leaf_edges.find(e.leaf.get());
        if (c != leaf_edges.end() && --c->second == 0) {
          leaf_edges.erase(c);
          t_leaf_hook(e.leaf.get());
        }
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
    for (auto& [leaf, count] : leaf_edges) t_leaf_hook(leaf);
  for (auto& n : ran) {
    n->release_saved();
    n->released = true;
  }
  if (!retain_graph) t_tape.compact();
}

}  // namespace engine
