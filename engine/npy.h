// NumPy's .npy format (version 1.0): a magic string, a Python-dict header ('descr',
// 'fortran_order', 'shape') padded to a multiple of 64 bytes, then the raw C-order little-endian
// data. Files written here open with numpy.load; for dumps a researcher analyses in Python
// (poscorr_app).
#pragma once

#include <string>

#include "engine/tensor.h"

namespace engine {

// Writes `t` (any device, any strides; f32, f64, i32, i64, u8, or f16 as '<f2'; bf16 is written
// as f32 since NumPy has no bfloat16) atomically (engine/file_io.h). Errors name the file.
void save_npy(const std::string& path, const Tensor& t);

// Reads a version 1.x/2.x .npy of '<f4', '<f8', '<i4', '<i8', '|u1' (or '<f2'), C order, into a
// CPU tensor of that dtype. Every problem (not .npy, another dtype, Fortran order, a bad header,
// a truncated body) is an engine::Error naming the file and what was expected.
Tensor load_npy(const std::string& path);

}  // namespace engine
