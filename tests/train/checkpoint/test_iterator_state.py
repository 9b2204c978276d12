"""The data iterator's state as a checkpoint item (train/checkpoint/iterator_state.py)."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.checkpoint.list_iterator import ListIterator
from train.checkpoint.iterator_state import decode_iterator_state, encode_iterator_state
from train.checkpoint.manager import Checkpointer


def test_iterator_state_encoding_keeps_tuples():
    state = {"a": (1, (2, 3)), "b": [4, (5,)], "c": {"d": np.int64(6), "e": None}}
    decoded = decode_iterator_state(encode_iterator_state(state))
    assert decoded == {"a": (1, (2, 3)), "b": [4, (5,)], "c": {"d": 6, "e": None}}
    assert isinstance(decoded["a"], tuple) and isinstance(decoded["b"], list)
    with pytest.raises(TypeError, match="data_iterator state"):
        encode_iterator_state({"x": object()})


def test_iterator_state_file_is_graincompatible_json(tmp_path):
    """The iterator item goes through grain's own handler: one process_<i>-of-<n>.json file
    holding `encode_iterator_state`'s text (tuples tagged, so they come back as tuples)."""
    iterator = ListIterator()
    iterator.position = 7
    with Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        checkpointer.save(1, state={"step": jnp.int32(1)}, data_iterator=iterator)
        iterator.position = 8  # after the save started: not in the checkpoint
    (written,) = (tmp_path / "1" / "iterator").glob("process_*.json")
    assert written.name == "process_0-of-1.json"
    assert decode_iterator_state(written.read_text()) == {"position": 7,
                                                          "slices": {"tokens": (-1, -1)}}
