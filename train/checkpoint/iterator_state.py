"""The data iterator's state as a checkpoint item: one JSON file per process, written and
read by grain's handler, in an encoding that keeps tuples as tuples (grain needs them; plain
JSON would turn them into lists)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import grain
import numpy as np
import orbax.checkpoint as ocp


_TUPLE_TAG = "__tuple__"


def _tag_tuples(value: Any, where: str) -> Any:
    if isinstance(value, tuple):
        return {_TUPLE_TAG: [_tag_tuples(v, where) for v in value]}
    if isinstance(value, list):
        return [_tag_tuples(v, where) for v in value]
    if isinstance(value, dict):
        if _TUPLE_TAG in value or not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where}: dict keys must be strings other than {_TUPLE_TAG!r}")
        return {k: _tag_tuples(v, where) for k, v in value.items()}
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"{where}: cannot store {type(value).__name__} {value!r} as JSON")


def _untag_tuples(value: Any) -> Any:
    if isinstance(value, list):
        return [_untag_tuples(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE_TAG}:
            return tuple(_untag_tuples(v) for v in value[_TUPLE_TAG])
        return {k: _untag_tuples(v) for k, v in value.items()}
    return value


def encode_iterator_state(state: Mapping[str, Any]) -> str:
    """JSON text of a data-iterator state that keeps tuples as tuples (grain needs them)."""
    return json.dumps(_tag_tuples(state, "data_iterator state"), sort_keys=True)


def decode_iterator_state(text: str) -> Any:
    """Inverse of `encode_iterator_state`."""
    return _untag_tuples(json.loads(text))


class _EncodedIteratorState:
    """An encoded iterator state, shown to grain's handler the way a DataLoaderIterator shows
    its own: get_state() -> bytes, set_state(bytes). grain writes and reads the file."""

    def __init__(self, text: str = ""):
        self.text = text

    def get_state(self) -> bytes:
        return self.text.encode()

    def set_state(self, encoded: bytes) -> None:
        self.text = encoded.decode()

    def start_prefetch(self) -> None:
        """grain's restore calls this; there is nothing to prefetch."""


class _IteratorStateHandler(grain.checkpoint.CheckpointHandler):
    """grain's iterator handler (process_<i>-of-<n>.json per process); only the encoding
    differs: `encode_iterator_state` keeps the tuples that plain JSON would turn into lists."""

    def save(self, directory, item=None, args=None):
        super().save(directory, args=grain.checkpoint.CheckpointSave(
            _EncodedIteratorState(args.state_json)))

    def restore(self, directory, item=None, args=None):
        encoded = _EncodedIteratorState()
        super().restore(directory, args=grain.checkpoint.CheckpointRestore(encoded))
        return decode_iterator_state(encoded.text)


@ocp.args.register_with_handler(_IteratorStateHandler, for_save=True)
@dataclasses.dataclass
class IteratorStateSave(ocp.args.CheckpointArgs):
    state_json: str                 # encode_iterator_state(iterator.get_state()), taken at save


@ocp.args.register_with_handler(_IteratorStateHandler, for_restore=True)
@dataclasses.dataclass
class IteratorStateRestore(ocp.args.CheckpointArgs):
    pass
