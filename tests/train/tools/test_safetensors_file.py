"""The safetensors writer and reader (train/tools/safetensors_file.py)."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from tests.seeds import case_seed
from train.tools.safetensors_file import (read_safetensors, read_safetensors_header,
                                          write_safetensors)


def test_safetensors_round_trip_and_byte_layout(tmp_path):
    rng = np.random.default_rng(case_seed(41))
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
               "b.weight": rng.standard_normal((7,)).astype(ml_dtypes.bfloat16),
               "c": rng.integers(-9, 9, (2, 1, 3)).astype(np.int32),
               "scalar": np.float32(rng.standard_normal()).reshape(()),
               "empty": np.zeros((0, 4), np.float32)}
    path = tmp_path / "t.safetensors"
    write_safetensors(path, tensors, metadata={"k": "v"})
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert length % 8 == 0
    header = json.loads(raw[8:8 + length])
    assert header["a"] == {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 60]}
    assert header["b.weight"]["dtype"] == "BF16"
    assert raw[8 + length:8 + length + 60] == tensors["a"].astype("<f4").tobytes()
    back, metadata = read_safetensors(path)
    assert metadata == {"k": "v"} and list(back) == list(tensors)
    for name, array in tensors.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        np.testing.assert_array_equal(back[name], array)
    path.write_bytes(raw[:-4])
    with pytest.raises(ValueError, match="offsets"):
        read_safetensors(path)
    with pytest.raises(TypeError, match="complex64"):
        write_safetensors(path, {"z": np.zeros(2, np.complex64)})


def test_a_small_file_byte_by_byte(tmp_path):
    """One int16 tensor [2] = (1, -2) and one bool [1]: the whole file written out by hand."""
    path = tmp_path / "small.safetensors"
    write_safetensors(path, {"x": np.array([1, -2], np.int16), "y": np.array([True])})
    header = (b'{"x":{"dtype":"I16","shape":[2],"data_offsets":[0,4]},'
              b'"y":{"dtype":"BOOL","shape":[1],"data_offsets":[4,5]}}')
    padded = header + b" " * (-len(header) % 8)
    assert path.read_bytes() == (struct.pack("<Q", len(padded)) + padded
                                 + b"\x01\x00\xfe\xff" + b"\x01")
    assert read_safetensors_header(path) == (json.loads(header), 8 + len(padded))


def test_damaged_files_and_bad_names_are_refused(tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="shorter than 8 bytes"):
        read_safetensors(path)
    path.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(ValueError, match="header says 100 bytes, file has 2"):
        read_safetensors(path)
    header = json.dumps({"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(ValueError, match="tensor 'x' has unsupported dtype 'C64'"):
        read_safetensors(path)
    for name in ("", "__metadata__"):
        with pytest.raises(ValueError, match="invalid tensor name"):
            write_safetensors(path, {name: np.zeros(1, np.float32)})
    with pytest.raises(TypeError, match="metadata: keys and values must be str"):
        write_safetensors(path, {"x": np.zeros(1, np.float32)}, metadata={"k": 1})
