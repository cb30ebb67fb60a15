"""Minimal safetensors reader/writer (the format: 8-byte little-endian header length, a JSON
header, then the raw little-endian tensors), written from the format description so the
reference does not share code with the engine's reader."""
import json
import struct

import numpy as np
import torch

_DTYPES = {
    "F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32,
    "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read(path):
    """-> (dict name -> torch tensor, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        if e["dtype"] == "BF16":
            u16 = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32)
        else:
            arr = np.frombuffer(data[begin:end], dtype=np.dtype(_DTYPES[e["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.copy().reshape(e["shape"]))
    return out, meta


def write(path, tensors, metadata=None):
    """tensors: dict name -> torch tensor or numpy array (written in the given order)."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        a = np.ascontiguousarray(a)
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
