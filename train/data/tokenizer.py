"""Tokenizers for the trainer: raw UTF-8 bytes, or a byte-level BPE trained with `tokenizers`.

    ByteTokenizer   text -> utf8 bytes b_1..b_n          ids b_i in [0, 256)
                    eos_id = 256 (document separator)     vocab_size = 257
    BPETokenizer    text -> byte-level pre-tokens -> BPE merges
                    eos token "<|endoftext|>"; ids in [0, vocab_size)

Both satisfy: decode(encode(s)) == s for every str s without lone surrogates, encode never
emits eos_id (text that spells "<|endoftext|>" is tokenised as ordinary text), and decode
drops eos_id. `encode_array` is the fast path used by the data pipeline (int32 numpy).

A tokenizer saved with `save(dir)` writes `dir/tokenizer_meta.json` (kind, vocab_size, eos_id,
fingerprint) and, for BPE, `dir/tokenizer.json`; `load_tokenizer(dir)` reads it back.
`load_tokenizer("byte")` builds the byte tokenizer. `fingerprint` is a sha256 hex digest of
the tokenizer's definition: equal fingerprints mean identical tokenisation.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

META_FILENAME = "tokenizer_meta.json"
BPE_FILENAME = "tokenizer.json"
BPE_EOS_TOKEN = "<|endoftext|>"
BYTE_VOCAB = 256


def _check_ids(ids: Sequence[int] | np.ndarray, vocab_size: int) -> np.ndarray:
    array = np.asarray(ids)
    if array.ndim != 1:
        raise ValueError(f"ids: expected a 1-D sequence of ints, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"ids: expected integers, got dtype {array.dtype}")
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        raise ValueError(
            f"ids: expected values in [0, {vocab_size}), got range "
            f"[{array.min()}, {array.max()}]"
        )
    return array.astype(np.int64, copy=False)


def _write_meta(directory: Path, meta: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / META_FILENAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are bytes, id 256 is EOS; vocab_size 257."""

    kind = "byte"
    vocab_size = BYTE_VOCAB + 1
    eos_id = BYTE_VOCAB

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(b"byte-tokenizer-v1:eos=256").hexdigest()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """int32 [n] token ids of `text` (no EOS appended)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of `ids`; EOS ids are dropped, invalid UTF-8 becomes U+FFFD."""
        array = _check_ids(ids, self.vocab_size)
        text_bytes = array[array < BYTE_VOCAB].astype(np.uint8).tobytes()
        return text_bytes.decode("utf-8", errors="replace")

    def save(self, directory: str | os.PathLike) -> None:
        _write_meta(
            Path(directory),
            {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id,
             "fingerprint": self.fingerprint},
        )

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=257, eos_id=256)"


class BPETokenizer:
    """Byte-level BPE from HuggingFace `tokenizers`, EOS token "<|endoftext|>"."""

    kind = "bpe"

    def __init__(self, definition_json: str):
        """definition_json: the `tokenizers.Tokenizer` JSON (as in tokenizer.json)."""
        from tokenizers import Tokenizer

        self._definition = definition_json
        self._tokenizer = Tokenizer.from_str(definition_json)
        # Not stored in the JSON (nor kept by pickling): text spelling the EOS token must
        # stay ordinary text, so a document can never inject a document boundary.
        self._tokenizer.encode_special_tokens = True
        eos_id = self._tokenizer.token_to_id(BPE_EOS_TOKEN)
        if eos_id is None:
            raise ValueError(f"definition_json: tokenizer has no {BPE_EOS_TOKEN!r} token")
        self.eos_id = int(eos_id)
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def __getstate__(self) -> dict:
        return {"definition_json": self._definition}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["definition_json"])

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self._definition.encode("utf-8")).hexdigest()

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_array(self, text: str) -> np.ndarray:
        """int32 [n] token ids of `text` (no EOS appended)."""
        return np.asarray(self.encode(text), dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of `ids`; EOS ids are dropped."""
        array = _check_ids(ids, self.vocab_size)
        return self._tokenizer.decode(array.tolist(), skip_special_tokens=True)

    def save(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / BPE_FILENAME).write_text(self._definition)
        _write_meta(
            directory,
            {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id,
             "fingerprint": self.fingerprint},
        )

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"


Tokenizer = ByteTokenizer | BPETokenizer


def _read_text(path: str | os.PathLike) -> str:
    return Path(path).read_bytes().decode("utf-8", errors="replace")


def train_bpe(
    files: Iterable[str | os.PathLike],
    vocab_size: int,
    out_path: str | os.PathLike | None = None,
    *,
    min_frequency: int = 2,
) -> BPETokenizer:
    """Trains a byte-level BPE on text files and returns it (saved to `out_path` if given).

    files: text files (read as UTF-8; undecodable bytes become U+FFFD).
    vocab_size: final vocabulary size including the 256 byte symbols and the EOS token;
        must be >= 257. The trainer may stop early if no pair reaches `min_frequency`.
    out_path: directory to `save` the tokenizer into (created if missing), or None.
    min_frequency: a pair must occur this often to be merged.
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if not isinstance(vocab_size, int) or vocab_size < BYTE_VOCAB + 1:
        raise ValueError(f"vocab_size: expected an int >= {BYTE_VOCAB + 1}, got {vocab_size!r}")
    paths = [Path(f) for f in files]
    if not paths:
        raise ValueError("files: expected at least one file, got none")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"files: not regular files: {missing[:5]}")

    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[BPE_EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((_read_text(p) for p in paths), trainer, length=len(paths))
    result = BPETokenizer(tokenizer.to_str())
    if out_path is not None:
        result.save(out_path)
    return result


def load_tokenizer(dir_or_spec: str | os.PathLike) -> Tokenizer:
    """"byte" -> ByteTokenizer; a directory written by `save` -> that tokenizer."""
    if str(dir_or_spec) == "byte":
        return ByteTokenizer()
    directory = Path(dir_or_spec)
    meta_path = directory / META_FILENAME
    if not directory.exists():
        raise ValueError(f"tokenizer {str(dir_or_spec)!r} does not exist (expected "
                         f"'byte' or a directory containing {META_FILENAME})")
    if not meta_path.is_file():
        raise ValueError(
            f"tokenizer: expected 'byte' or a directory containing {META_FILENAME}, "
            f"got {str(dir_or_spec)!r}"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("kind") == "byte":
        tokenizer: Tokenizer = ByteTokenizer()
    elif meta.get("kind") == "bpe":
        tokenizer = BPETokenizer((directory / BPE_FILENAME).read_text())
    else:
        raise ValueError(f"{meta_path}: unknown tokenizer kind {meta.get('kind')!r}")
    if meta.get("fingerprint") not in (None, tokenizer.fingerprint):
        raise ValueError(
            f"{meta_path}: fingerprint {meta['fingerprint']} does not match the loaded "
            f"tokenizer ({tokenizer.fingerprint}); the directory is inconsistent"
        )
    return tokenizer
