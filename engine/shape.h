// Shapes and strides: helpers shared by the tensor core and the ops (broadcasting, dim wrapping,
// printing "(4, 7)").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace engine {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);
std::string shape_str(const Shape& s);  // "(4, 7)"; scalars print as "()"

// Wraps a possibly negative dim into [0, ndim); throws "[op] dim d out of range for ndim n".
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// NumPy broadcasting of two shapes; throws "[op] shapes a and b cannot be broadcast".
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// True when `from` can be broadcast to `to` (trailing alignment, sizes equal or 1).
bool is_broadcastable_to(const Shape& from, const Shape& to);

// Strides for viewing a tensor of shape `from` (with `strides`) as the broadcast shape `to`:
// leading new dims and size-1 dims get stride 0.
std::vector<int64_t> broadcast_strides(const Shape& from, const std::vector<int64_t>& strides,
                                       const Shape& to);

}  // namespace engine
