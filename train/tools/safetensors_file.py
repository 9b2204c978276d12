"""Reading and writing the safetensors file format (numpy arrays by name), without dependencies.

    file   = u64 little-endian N  |  N bytes of UTF-8 JSON header  |  data bytes
    header = {name: {"dtype": "F32"|"BF16"|..., "shape": [d0, ...],
                     "data_offsets": [begin, end]}, "__metadata__": {str: str}}
    each tensor's bytes are C-order little-endian, data[begin:end] (offsets into the data part),
    tensors stored back to back in header order; the header is padded with spaces to 8 bytes.

bfloat16 is written from ml_dtypes.bfloat16 arrays (what jax.numpy.bfloat16 is).
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path
from typing import Mapping

import ml_dtypes
import numpy as np

DTYPE_CODES = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16", np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
HEADER_ALIGNMENT = 8


def _little_endian(array: np.ndarray) -> np.ndarray:
    """The array with its bytes in little-endian order (a copy only on a big-endian host)."""
    return array if sys.byteorder == "little" else array.byteswap()


def write_safetensors(path: str | Path, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` (name -> numpy array of a dtype in DTYPE_CODES) to `path`."""
    header: dict = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata: keys and values must be str")
        header["__metadata__"] = dict(metadata)
    blobs, offset = [], 0
    for name, array in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"tensors: invalid tensor name {name!r}")
        array = np.asarray(array)
        if array.dtype not in DTYPE_CODES:
            raise TypeError(f"tensors[{name!r}]: dtype {array.dtype} is not storable, expected one "
                            f"of {sorted(str(d) for d in DTYPE_CODES)}")
        blob = _little_endian(np.ascontiguousarray(array)).tobytes()
        header[name] = {"dtype": DTYPE_CODES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % HEADER_ALIGNMENT)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for blob in blobs:
            file.write(blob)


def read_safetensors_header(path: str | Path) -> tuple[dict, int]:
    """(header dict, byte offset where the data part starts) of a safetensors file."""
    with open(path, "rb") as file:
        prefix = file.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", prefix)
        raw = file.read(length)
    if len(raw) != length:
        raise ValueError(f"{path}: header says {length} bytes, file has {len(raw)}")
    return json.loads(raw.decode("utf-8")), 8 + length


def read_safetensors(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(name -> numpy array, metadata) of a safetensors file; checks offsets and sizes."""
    header, start = read_safetensors_header(path)
    data = Path(path).read_bytes()[start:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        if entry["dtype"] not in CODE_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {entry['dtype']!r}")
        dtype = CODE_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end - begin != math.prod(shape) * dtype.itemsize or end > len(data):
            raise ValueError(f"{path}: tensor {name!r} offsets {begin}..{end} do not match shape "
                             f"{shape} of {entry['dtype']} (data part is {len(data)} bytes)")
        tensors[name] = _little_endian(np.frombuffer(data[begin:end], dtype)).reshape(shape)
    return tensors, metadata
