// Reference-counted bytes on one device. Tensors share a Storage through shared_ptr; views point
// into it with an offset and strides.
#pragma once

#include <cstddef>
#include <memory>

#include "engine/allocator.h"

namespace engine {

class Storage {
 public:
  Storage(size_t nbytes, Allocator& alloc)
      : alloc_(&alloc), nbytes_(nbytes), data_(alloc.allocate(nbytes)) {}
  ~Storage() { alloc_->deallocate(data_, nbytes_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return alloc_->device(); }

 private:
  Allocator* alloc_;
  size_t nbytes_;
  void* data_;
};

}  // namespace engine
