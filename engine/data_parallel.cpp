// GradReducer: bucketed gradient all-reduce started from the autograd leaf hook.
#include "engine/data_parallel.h"

#include <algorithm>
#include <chrono>

#include "engine/autograd.h"
#include "engine/error.h"

namespace engine {

GradReducer::GradReducer(const FlatParameters& flat, Communicator& comm, int64_t bucket_bytes,
                         ReduceOp op, DType reduce_dtype)
    : flat_(flat), comm_(comm), op_(op) {
  ENGINE_CHECK(bucket_bytes > 0, "[ddp] bucket_bytes must be positive");
  ENGINE_CHECK(reduce_dtype == flat.grad().dtype() ||
                   (reduce_dtype == DType::bf16 && flat.grad().dtype() == DType::f32),
               "[ddp] gradients of ", dtype_name(flat.grad().dtype()), " reduce in their own dtype",
               " or, from f32, in bf16; got ", dtype_name(reduce_dtype));
  ENGINE_CHECK(reduce_dtype == flat.grad().dtype() || op == ReduceOp::sum,
               "[ddp] a bf16 gradient all-reduce sums (ReduceOp::sum): scale the loss instead");
  if (reduce_dtype != flat.grad().dtype() && comm.size() > 1)
    wire_ = Tensor::empty({flat.grad().numel()}, reduce_dtype, flat.grad().device());
  const auto& entries = flat.entries();
  const int64_t esize = static_cast<int64_t>(dtype_size(flat.grad().dtype()));
  const int64_t total = flat.grad().numel();
  // From the end of the slab: each bucket closes once it holds bucket_bytes.
  int64_t end = total;
  Bucket b;
  b.end = end;
  for (size_t i = entries.size(); i-- > 0;) {
    const auto& e = entries[i];
    b.begin = e.offset;
    ++b.params;
    bucket_of_[e.param.impl()] = static_cast<int>(buckets_.size());
    if ((b.end - b.begin) * esize >= bucket_bytes || i == 0) {
      if (i == 0) b.begin = 0;
      buckets_.push_back(b);
      b = Bucket{};
      b.end = e.offset;
    }
  }
}

void GradReducer::begin() {
  ENGINE_CHECK(!hook_, "[ddp] begin() twice without finish()");
  if (comm_.size() == 1) return;
  hook_.emplace([this](const TensorImpl* leaf) { on_leaf_ready(leaf); });
}

void GradReducer::on_leaf_ready(const TensorImpl* leaf) {
  auto it = bucket_of_.find(leaf);
  if (it == bucket_of_.end()) return;  // not one of ours
  ++buckets_[size_t(it->second)].ready;
  start_ready_buckets(false);
}

void GradReducer::start_ready_buckets(bool all) {
  while (next_ < buckets_.size() && (all || buckets_[next_].ready >= buckets_[next_].params)) {
    const Bucket& b = buckets_[next_];
    Tensor g = flat_.grad_slice(b.begin, b.end);  // deferred zeros of the bucket made
    if (wire_.defined()) {  // bf16 on the wire: the rounded copy goes (stream-ordered after it)
      Tensor w = wire_.slice(0, b.begin, b.end);
      NoGrad ng;
      w.copy_(g);
      g = w;
    }
    works_.push_back(comm_.all_reduce_async(g, op_));
    ++next_;
  }
}

void GradReducer::finish() {
  hook_.reset();
  exposed_s_ = 0;
  started_early_ = static_cast<int64_t>(next_);
  if (comm_.size() > 1) {
    const auto t0 = std::chrono::steady_clock::now();
    start_ready_buckets(true);
    for (auto& w : works_) w->wait();
    if (wire_.defined()) {  // widened back into the f32 slab
      NoGrad ng;
      flat_.grad().copy_(wire_);
    }
    exposed_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Ready for the next step.
  works_.clear();
  next_ = 0;
  for (auto& b : buckets_) b.ready = 0;
}

void broadcast_parameters(const FlatParameters& flat, Communicator& comm, int root) {
  if (comm.size() > 1) comm.broadcast(flat.data(), root);
}

}  // namespace engine
