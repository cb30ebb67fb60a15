// Modules own parameters under names ("encoder.layer.3.attn.qkv.weight") so that optimizers,
// checkpoints and all-reduce can walk them, and FlatParameters moves a model's parameters into
// one contiguous slab (and their gradients into a second) so clipping, all-reduce and AdamW run
// once over contiguous memory.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace engine {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;  // children are registered by address
  Module& operator=(const Module&) = delete;

  // Registers a trainable leaf under `name` (letters, digits, '_'; unique) and marks it as
  // requiring grad. Returns a handle that shares the TensorImpl with the stored one.
  Tensor register_parameter(const std::string& name, Tensor value);
  // Registers a child (a member of this module); its parameters appear as "name.<param>".
  void register_module(const std::string& name, Module& child);

  NamedTensors named_parameters() const;  // depth-first, in registration order
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;  // total elements
  void zero_grad();
  void train(bool on = true);
  bool training() const { return training_; }

 private:
  void collect(const std::string& prefix, NamedTensors& out) const;
  void check_name(const std::string& name, const char* what) const;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

class FlatParameters {
 public:
  struct Entry {
    std::string name;
    Tensor param;
    int64_t offset = 0;  // element offset in the slabs
    int64_t numel = 0;
  };
  // Moves each parameter's values into one slab (each entry aligned to 16 elements; padding stays
  // zero: nothing writes it, and the gradient slab's padding is summed by the norm) and re-points
  // the parameter at it, so every handle to it (a model's members too) now views the slab. Each
  // parameter's .grad becomes a view into a zeroed gradient slab, where backward accumulates. All
  // parameters must be floating leaves of one dtype on one device.
  explicit FlatParameters(const NamedTensors& params);
  // The same, with the slabs on `device`: the parameters (and any gradients they hold) are
  // copied there, so this is how a model built on the CPU moves to a GPU, every handle included.
  FlatParameters(const NamedTensors& params, Device device);

  const Tensor& data() const { return data_; }  // 1-D
  // 1-D, same layout; zeroes first what a deferred zero_grad left to the first writer and no
  // backward wrote (so every reader sees the sums).
  const Tensor& grad() const;
  // Elements [begin, end) of grad(), zeroing only the deferred entries they overlap (a bucket of
  // the data-parallel all-reduce, while the backward still writes the others).
  Tensor grad_slice(int64_t begin, int64_t end) const;
  const std::vector<Entry>& entries() const { return entries_; }
  int64_t numel() const { return data_.numel(); }
  // Zeroes every gradient: on the CPU a fill of the slab; on a device deferred
  // (AutogradMeta::grad_fresh): the first backward's writers overwrite instead of adding (a GEMM
  // with beta 0, a bias gradient straight from cuBLASLt's epilogue), and grad() zeroes what none
  // wrote. No pass over the slab for the gradients the backward writes whole.
  void zero_grad();

 private:
  Tensor data_, grad_;
  std::vector<Entry> entries_;
};

}  // namespace engine
