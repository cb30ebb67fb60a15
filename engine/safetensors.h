// Checkpoint I/O in the Hugging Face safetensors format: an 8-byte little-endian header length,
// a JSON header (name -> dtype, shape, data_offsets; optional "__metadata__"), then the raw
// row-major little-endian tensor bytes. Files written here load in Python's safetensors and back.
#pragma once

#include <map>
#include <string>

#include "engine/module.h"

namespace engine {

using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsContents {
  NamedTensors tensors;          // CPU tensors, in data-offset order, with their file dtypes
  SafetensorsMetadata metadata;  // "__metadata__" (empty if absent)
};

// Writes atomically: to "<path>.tmp.<pid>", fsync, rename over `path`, fsync the directory, so a
// crash never leaves a half-written file at `path`. Tensors may be on any device and have any
// strides (they are copied to host, contiguous) and are laid out in the order given. Names must
// be unique, non-empty and not "__metadata__"; names and metadata must be valid UTF-8.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const SafetensorsMetadata& metadata = {});

// Reads and validates the whole file (see docs/architecture.md for what is checked); every
// problem is an engine::Error naming the path. BOOL tensors load as u8.
SafetensorsContents load_safetensors(const std::string& path);

// Reads and validates the header only (the data bytes are not read).
SafetensorsMetadata read_safetensors_metadata(const std::string& path);

// Loads a checkpoint into existing tensors (e.g. a model's named_parameters()) under NoGrad,
// converting nothing: every name in `dest` must be in the file with the same shape and dtype, and
// tensors in the file that are not in `dest` are an error unless `allow_extra`. The error names
// the first mismatch in `dest`'s order (extra file tensors are reported after that). The whole
// header is checked before any tensor in `dest` is written. Copies with copy_ (dest may be CUDA).
// Returns what the file holds besides `dest`: the metadata and, with allow_extra, the other
// tensors (CPU) — so a training checkpoint's weights and optimizer state come from one read.
SafetensorsContents load_safetensors_into(const std::string& path, const NamedTensors& dest,
                           bool allow_extra = false);

}  // namespace engine
