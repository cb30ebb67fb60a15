// Shape arithmetic: numel, strides, broadcasting, printing.
#include "engine/shape.h"

#include "engine/error.h"

namespace engine {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    // A shape from a file can have an element count that fits (a zero dimension) and strides
    // that do not: (0, 2^62, 4).
    ENGINE_CHECK(i == 0 || !__builtin_mul_overflow(acc, s[i] > 0 ? s[i] : 1, &acc),
                 "[tensor] shape ", shape_str(s), " is too large: its strides overflow 64 bits");
  }
  return st;
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + ")";
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  ENGINE_CHECK(d >= 0 && d < ndim, "[", op, "] dim ", dim, " is out of range for a tensor with ",
               ndim, " dims");
  return d;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    ENGINE_CHECK(da == db || da == 1 || db == 1, "[", op, "] shapes ", shape_str(a), " and ",
                 shape_str(b), " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool is_broadcastable_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  return true;
}

std::vector<int64_t> broadcast_strides(const Shape& from, const std::vector<int64_t>& strides,
                                       const Shape& to) {
  ENGINE_ASSERT(is_broadcastable_to(from, to));
  std::vector<int64_t> out(to.size(), 0);
  size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) out[lead + i] = (from[i] == 1) ? 0 : strides[i];
  return out;
}

}  // namespace engine
