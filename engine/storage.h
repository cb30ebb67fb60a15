// Reference-counted bytes on one device. Tensors share a Storage through shared_ptr; views point
// into it with an offset and strides.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/allocator.h"

namespace engine {

class Storage {
 public:
  Storage(size_t nbytes, Allocator& alloc)
      : alloc_(&alloc),
        nbytes_(nbytes),
        data_(alloc.allocate(nbytes)),
        counted_(alloc.device().type != DeviceType::CPU) {}
  ~Storage() { alloc_->deallocate(data_, nbytes_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return alloc_->device(); }

  // On a device: a count of the times a tensor handed out a pointer into these bytes
  // (Tensor::raw_data, reads and writes alike; a CPU storage keeps 0). Values derived from the
  // bytes and kept across a stretch of work (the trainer's 16-bit copy of the parameter slab,
  // train/trainer.h) are still theirs while the generation has not moved: nothing can have
  // written them without a pointer.
  uint64_t generation() const { return generation_.load(std::memory_order_relaxed); }
  void note_access() {
    if (counted_) generation_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  Allocator* alloc_;
  size_t nbytes_;
  void* data_;
  bool counted_;
  std::atomic<uint64_t> generation_{0};
};

}  // namespace engine
