// Checkpoint I/O in the Hugging Face safetensors format: an 8-byte little-endian header length,
// a JSON header (name -> dtype, shape, data_offsets; optional "__metadata__"), then the raw
// row-major little-endian tensor bytes. Files written here load in Python's safetensors and back.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/module.h"

namespace engine {

using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsContents {
  NamedTensors tensors;          // CPU tensors, in data-offset order, with their file dtypes
  SafetensorsMetadata metadata;  // "__metadata__" (empty if absent)
  std::vector<std::string>
      skipped;  // tensors left unread (load_safetensors_into, ExtraTensors::skip)
  // The file carries checksums (every file save_safetensors writes does) and the header and
  // every tensor read matched them. False for files of other writers, which load unverified.
  bool checksummed = false;
};

// Writes atomically: to "<path>.tmp.<pid>", fsync, rename over `path`, fsync the directory, so a
// crash never leaves a half-written file at `path`; a failed write (a full disk, EFBIG) is an
// engine::Error naming the file and the OS error, and leaves `path` as it was. Tensors may be on
// any device and have any strides (they are copied to host, contiguous) and are laid out in the
// order given. Names must be unique, non-empty and not "__metadata__"; names and metadata must be
// valid UTF-8. The metadata gets CRC-32 checksums of the header ("engine.header_crc32") and of
// every tensor ("engine.crc32.<name>"), so keys of that form are reserved.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const SafetensorsMetadata& metadata = {});

// Reads and validates the whole file (see docs/architecture.md for what is checked); every
// problem is an engine::Error naming the path. BOOL tensors load as u8. When the file carries
// checksums, the header and every tensor are verified ("tensor '<name>' fails its checksum
// (stored crc32 .., computed ..): the file is damaged"); the returned metadata omits them.
SafetensorsContents load_safetensors(const std::string& path);

// Reads and validates the header only (its checksum too; the data bytes are not read).
SafetensorsMetadata read_safetensors_metadata(const std::string& path);

// What load_safetensors_into does with tensors in the file that the destination does not name.
enum class ExtraTensors {
  error,  // the first one is an error (a model must match its file exactly)
  skip,   // accepted and not read: their names come back in SafetensorsContents::skipped
  read,   // read and returned in SafetensorsContents::tensors (a training checkpoint's state)
};

// Loads a checkpoint into existing tensors (e.g. a model's named_parameters()) under NoGrad,
// converting nothing: every name in `dest` must be in the file with the same shape and dtype;
// tensors in the file that are not in `dest` follow `extra`. The error names the first mismatch
// in `dest`'s order (extra file tensors are reported after that). The whole header is checked
// before any tensor in `dest` is written; a tensor failing its checksum is found as it is read,
// so `dest` may then be partly overwritten. Copies with copy_ (dest may be CUDA). Returns what the
// file holds besides `dest`: the metadata and the other tensors (read) or their names (skip) —
// so a training checkpoint's weights and optimizer state come from one read, and an encoder can
// be taken from a training checkpoint without reading its optimizer state.
SafetensorsContents load_safetensors_into(const std::string& path, const NamedTensors& dest,
                                          ExtraTensors extra = ExtraTensors::error);

}  // namespace engine
