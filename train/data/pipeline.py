"""Language-model data: documents -> tokens -> packed rows -> batches (a grain pipeline).

    documents   d_0..d_{N-1}: files sorted by key = path relative to the source root, or
                ArrayRecord records in shard order with the keys of their manifest;
                optional cap: the first max_documents
    split       u(d) = blake2b_64(key(d)) / 2^64;  eval = {d : u(d) < heldout_fraction}
                (at least one eval document: the smallest u); train = the rest
    per process p of P: the documents of the split with index i, i % P == p (disjoint)
    doc tokens  t(d) = tokenizer.encode(text(d)) ++ [eos_id]          int32, length n_d + 1
    stream      concatenation of t(d) over the process's documents in a seeded order,
                reshuffled every epoch (documents are never cut apart other than by rows)
    rows        r_k = stream[k (L+1) : (k+1) (L+1)]                        L = seq_len
    segment_ids s_k[j] = number of document pieces of r_k starting at or before j
                (1 for the row's first, possibly continued, document, 2 for the next, ...)
    shuffle     shuffle_mode "window": a seeded shuffle within windows of `shuffle_window`
                consecutive rows (neighbouring rows, often pieces of one long document, land
                in nearby batches);
                shuffle_mode "global": the process's documents packed once, in one seeded
                order, into R = floor(sum_d (n_d + 1) / (L+1)) rows that are read by index
                (`PackedRows`, a random-access source), and grain's index shuffle permutes
                all R rows, with a new permutation every epoch (seed + epoch); the tail of
                fewer than L+1 tokens is left out. The lengths n_d come from a tokenising
                pass at start, or from the manifest of ArrayRecord shards. The iterator state is the position in
                the permuted index sequence, so resuming is exact and free.
    batch       {"tokens": int32 [B, L+1], "segment_ids": int32 [B, L+1]}, B = batch_size
                per process; the last incomplete row/batch of a finite stream is dropped.

Inputs and targets come from the same row shifted by one (`split_inputs_and_targets`):
    inputs = tokens[:, :-1], targets = tokens[:, 1:], segment_ids = segment_ids[:, :-1],
    loss_mask[:, j] = segment_ids[:, j] == segment_ids[:, j+1].
So the target at a document's last text token is that document's EOS (same segment), while
the position holding EOS (whose next token starts another document) carries no loss. A
document cut by a row boundary continues in the next row as a new segment; the pair that
straddles two rows is never a training target (1 of L+1 transitions).

Iterator state: `it = iter(make_dataset(...))`; `it.get_state()` / `it.set_state(state)`
reproduce the exact stream (`it.close()` stops its background threads/processes). The
state holds tuples that plain `json` turns into lists, which grain's packer then misreads
(it drops a document): serialise it with `encode_iterator_state` / `decode_iterator_state`
of train/checkpoint/iterator_state.py (the checkpointer does).

The documents come from train/data/sources.py.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import threading
from typing import Any

import grain
import numpy as np
from grain.experimental import ConcatThenSplitIterDataset, ThreadPrefetchIterDataset

from train.data.sources import ArrayRecordCorpus, Corpus, check_int, resolve_source
from train.data.tokenizer import Tokenizer

SPLITS = ("train", "eval", "all")


def heldout_score(key: str) -> float:
    """u(key) in [0, 1): a stable hash of the document key (same on every machine)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def split_document_indices(keys, *, split: str, heldout_fraction: float) -> list[int]:
    """Indices (ascending) of the documents of `split` in "train" | "eval" | "all"."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction: expected a value in (0, 1), got {heldout_fraction!r}")
    if split == "all":
        return list(range(len(keys)))
    scores = [heldout_score(k) for k in keys]
    heldout = {i for i, u in enumerate(scores) if u < heldout_fraction}
    if not heldout:
        heldout = {min(range(len(keys)), key=scores.__getitem__)}
    if len(heldout) == len(keys):
        raise ValueError(
            f"heldout_fraction: all {len(keys)} documents fall in the held-out split; "
            "use more documents or a smaller fraction"
        )
    chosen = heldout if split == "eval" else set(range(len(keys))) - heldout
    return sorted(chosen)


def process_document_indices(
    corpus: Corpus,
    *,
    split: str,
    heldout_fraction: float,
    process_index: int = 0,
    process_count: int = 1,
) -> list[int]:
    """Document indices read by process `process_index`: disjoint across processes."""
    if not isinstance(process_count, int) or process_count < 1:
        raise ValueError(f"process_count: expected an int >= 1, got {process_count!r}")
    if not isinstance(process_index, int) or not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index: expected an int in [0, {process_count}), got {process_index!r}"
        )
    indices = split_document_indices(corpus.keys, split=split, heldout_fraction=heldout_fraction)
    mine = indices[process_index::process_count]
    if not mine:
        raise ValueError(
            f"process_count: split {split!r} has {len(indices)} documents, fewer than the "
            f"{process_count} processes"
        )
    return mine


class _DocumentTokens:
    """Document index -> {"tokens": int32 [n_d + 1]} (text ids followed by EOS)."""

    def __init__(self, corpus: Corpus, tokenizer: Tokenizer):
        self._corpus = corpus
        self._tokenizer = tokenizer
        self._eos = np.asarray([tokenizer.eos_id], dtype=np.int32)
        self._records = (
            grain.sources.ArrayRecordDataSource(list(corpus.shard_paths))
            if isinstance(corpus, ArrayRecordCorpus)
            else None
        )

    def length(self, index: int) -> int:
        """n_d + 1 (the EOS included): from the manifest where it has the lengths, else by
        reading the document."""
        if self._records is None:
            return len(self._tokenizer.encode_array(self._corpus.read_text(index))) + 1
        if self._corpus.lengths is not None:
            return self._corpus.lengths[index] + 1
        return len(self._records[index]) // 4 + 1

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        if self._records is None:
            ids = self._tokenizer.encode_array(self._corpus.read_text(index))
        else:
            ids = np.frombuffer(self._records[index], dtype="<i4").astype(np.int32)
        return {"tokens": np.concatenate([ids, self._eos])}


class PackedRows:
    """Random access to the rows of a packed document stream (shuffle_mode "global").

    Documents `order[0], order[1], ...` concatenated (each followed by EOS) and cut into rows
    of L+1 tokens; row k = stream[k (L+1) : (k+1) (L+1)], segment ids numbering its document
    pieces from 1. Only the lengths are kept (one tokenising pass at construction); a row
    reads the documents it overlaps, the last few of them cached.
    """

    _CACHED_DOCUMENTS = 16

    def __init__(self, documents: _DocumentTokens, order: list[int], seq_len: int):
        self._documents = documents
        self._order = np.asarray(order, np.int64)
        self._row_length = seq_len + 1
        lengths = [documents.length(int(i)) for i in self._order]
        self._starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        self._rows = int(self._starts[-1] // self._row_length)
        self._cache: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._rows

    def __getstate__(self):   # pickled into grain workers without the cache and lock
        return {key: value for key, value in self.__dict__.items()
                if key not in ("_cache", "_lock")}

    def __setstate__(self, state):
        self.__dict__.update(state, _cache={}, _lock=threading.Lock())

    def _document(self, position: int) -> np.ndarray:
        with self._lock:
            tokens = self._cache.get(position)
        if tokens is None:
            tokens = self._documents(int(self._order[position]))["tokens"]
            with self._lock:
                if len(self._cache) >= self._CACHED_DOCUMENTS:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[position] = tokens
        return tokens

    def __getitem__(self, row: int) -> dict[str, np.ndarray]:
        row = int(row) % self._rows
        begin, end = row * self._row_length, (row + 1) * self._row_length
        position = int(np.searchsorted(self._starts, begin, side="right")) - 1
        tokens, segments, cursor = [], [], begin
        while cursor < end:
            start = int(self._starts[position])
            piece = self._document(position)[cursor - start:end - start]
            tokens.append(piece)
            segments.append(np.full(len(piece), len(segments) + 1, np.int32))
            cursor += len(piece)
            position += 1
        return {"tokens": np.concatenate(tokens).astype(np.int32),
                "segment_ids": np.concatenate(segments)}


def _packed_row(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"tokens": row["tokens"], "segment_ids": row["tokens_segment_ids"]}


def _row_is_full(row: dict[str, np.ndarray]) -> bool:
    return bool(row["segment_ids"][-1] > 0)  # padding (segment id 0) only fills a tail


class RowWindowShuffle(grain.IterDataset):
    """Reads `window_size` elements, yields them permuted (permutation seeded by (seed, window
    number)), repeats. Checkpointable: the state is the parent state at the window start,
    the window number and the position in the window. (grain's WindowShuffleIterDataset
    does the same but spends ~2 ms per element in its index shuffle.)"""

    def __init__(self, parent: grain.IterDataset, *, window_size: int, seed: int):
        super().__init__(parent)
        self._window_size = window_size
        self._seed = seed

    def __iter__(self) -> grain.DatasetIterator:
        return _RowWindowShuffleIterator(self._parent.__iter__(), self._window_size, self._seed)


class _RowWindowShuffleIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, window_size: int, seed: int):
        super().__init__(parent)
        self._window_size = window_size
        self._seed = seed
        self._window_start_state = parent.get_state()
        self._window_index = -1  # no window read yet
        self._window: list[Any] = []
        self._order = np.zeros((0,), np.int64)
        self._position = 0

    def _read_window(self, window_index: int) -> None:
        self._window_start_state = copy.deepcopy(self._parent.get_state())
        self._window = list(itertools.islice(self._parent, self._window_size))
        rng = np.random.default_rng([self._seed, window_index])
        self._order = rng.permutation(len(self._window))
        self._window_index = window_index
        self._position = 0

    def __next__(self) -> Any:
        if self._position >= len(self._window):
            self._read_window(self._window_index + 1)
            if not self._window:
                raise StopIteration
        element = self._window[self._order[self._position]]
        self._position += 1
        return element

    def get_state(self) -> dict[str, Any]:
        return {"window_start_state": copy.deepcopy(self._window_start_state),
                "window_index": self._window_index, "position": self._position}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["window_start_state"])
        if state["window_index"] < 0:  # nothing read yet
            self._window_start_state = copy.deepcopy(state["window_start_state"])
            self._window_index, self._window, self._position = -1, [], 0
            return
        self._read_window(state["window_index"])
        self._position = state["position"]


def _use_default_absl_flags() -> None:
    """grain's worker processes read absl flags; outside absl.app they are never parsed."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def make_dataset(
    *,
    source: str,
    tokenizer: Tokenizer,
    seq_len: int,
    batch_size: int,
    split: str = "train",
    seed: int = 0,
    heldout_fraction: float = 0.02,
    process_index: int = 0,
    process_count: int = 1,
    num_epochs: int | None = None,
    worker_count: int = 0,
    max_documents: int | None = None,
    shuffle: bool | None = None,
    shuffle_mode: str = "window",
    shuffle_window: int = 64,
    read_threads: int = 4,
    prefetch_buffer_size: int = 2,
) -> grain.IterDataset:
    """A grain IterDataset of packed LM batches (see the module docstring for the math).

    source: "stdlib" | directory | glob | "arrayrecord:<glob or dir>".
    tokenizer: ByteTokenizer / BPETokenizer (for arrayrecord sources: the one that wrote them,
        checked by fingerprint).
    seq_len: L; rows hold L+1 tokens so that inputs/targets are the row shifted by one.
    batch_size: rows per batch on THIS process (global batch = batch_size * process_count).
    split: "train" | "eval" | "all" (all documents, no held-out split).
    seed: seeds the document order (reshuffled each epoch) and the row window shuffle.
    heldout_fraction: expected share of documents in the eval split (at least one document).
    process_index, process_count: this process reads only its 1/process_count of documents.
    num_epochs: None repeats forever; k stops after k passes (incomplete tail dropped).
    worker_count: grain multiprocessing workers (0 = in-process). With k > 0 each worker
        packs its own slice of the documents, so the exact stream depends on k; workers are
        spawned (the main script needs an `if __name__ == "__main__":` guard) and starting
        them takes seconds, so create such an iterator once, not per evaluation.
    max_documents: use only the first max_documents sorted documents (fast tests/smoke runs).
    shuffle: shuffle documents and rows; default True for "train", False otherwise.
    shuffle_mode: "window" (rows shuffled within windows of `shuffle_window`) or "global"
        (every row of the epoch permuted by grain, reshuffled each epoch; module docstring).
    shuffle_window: rows per window of the window shuffle (1 disables it).
    read_threads: threads reading and tokenising documents ahead in each process/worker.
    prefetch_buffer_size: batches prepared ahead by a background thread (0 disables).

    Yields {"tokens": int32 [batch_size, seq_len+1], "segment_ids": int32 [...same]}.
    """
    check_int("seq_len", seq_len, 1)
    check_int("batch_size", batch_size, 1)
    check_int("seed", seed, 0)
    check_int("worker_count", worker_count, 0)
    check_int("shuffle_window", shuffle_window, 1)
    check_int("read_threads", read_threads, 0)
    check_int("prefetch_buffer_size", prefetch_buffer_size, 0)
    if num_epochs is not None:
        check_int("num_epochs", num_epochs, 1)
    if shuffle_mode not in ("window", "global"):
        raise ValueError(f"shuffle_mode: expected 'window' or 'global', got {shuffle_mode!r}")
    if seed >= 2**31:
        raise ValueError(f"seed: expected an int in [0, 2**31), got {seed}")
    for name in ("eos_id", "vocab_size", "fingerprint", "encode_array"):
        if not hasattr(tokenizer, name):
            raise TypeError(f"tokenizer: expected a train.data.tokenizer tokenizer, got {tokenizer!r}")
    corpus = resolve_source(source, max_documents=max_documents)
    if isinstance(corpus, ArrayRecordCorpus) and corpus.tokenizer_fingerprint not in (
        None, tokenizer.fingerprint
    ):
        raise ValueError(
            f"tokenizer: fingerprint {tokenizer.fingerprint[:12]}... differs from the one that "
            f"wrote {source!r} ({corpus.tokenizer_fingerprint[:12]}...); load the tokenizer "
            "saved beside the shards"
        )
    indices = process_document_indices(
        corpus, split=split, heldout_fraction=heldout_fraction,
        process_index=process_index, process_count=process_count,
    )
    if shuffle is None:
        shuffle = split == "train"

    if shuffle_mode == "global":
        batches = _globally_shuffled_rows(
            _DocumentTokens(corpus, tokenizer), indices, seq_len=seq_len, seed=seed,
            shuffle=shuffle, num_epochs=num_epochs, read_threads=read_threads,
        ).batch(batch_size, drop_remainder=True)
        return _prefetched(batches, worker_count, prefetch_buffer_size)

    documents = grain.MapDataset.source(indices)
    if shuffle:
        documents = documents.shuffle(seed=seed)
    documents = documents.repeat(num_epochs).map(_DocumentTokens(corpus, tokenizer))
    rows = documents.to_iter_dataset(
        grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(4 * read_threads, 1))
    )
    rows = ConcatThenSplitIterDataset(rows, length_struct={"tokens": seq_len + 1})
    rows = rows.map(_packed_row)
    if num_epochs is not None:
        rows = rows.filter(_row_is_full)
    if shuffle and shuffle_window > 1:
        rows = RowWindowShuffle(rows, window_size=shuffle_window, seed=seed + 1)
    batches = rows.batch(batch_size, drop_remainder=True)
    return _prefetched(batches, worker_count, prefetch_buffer_size)


def _globally_shuffled_rows(documents: _DocumentTokens, indices: list[int], *, seq_len: int,
                            seed: int, shuffle: bool, num_epochs: int | None,
                            read_threads: int) -> grain.IterDataset:
    """PackedRows of the documents (in a seeded order), permuted anew each epoch by grain."""
    order = (list(np.random.default_rng([seed, 0]).permutation(indices)) if shuffle
             else list(indices))
    source = PackedRows(documents, order, seq_len)
    if not len(source):
        raise ValueError(f"seq_len: the {len(indices)} documents of this split hold fewer than "
                         f"seq_len + 1 = {seq_len + 1} tokens, not one row")
    rows = grain.MapDataset.source(source)
    if shuffle:
        rows = rows.shuffle(seed=seed + 1)
    rows = rows.repeat(num_epochs)
    return rows.to_iter_dataset(
        grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(4 * read_threads, 1)))


def _prefetched(batches: grain.IterDataset, worker_count: int,
                prefetch_buffer_size: int) -> grain.IterDataset:
    if worker_count > 0:
        _use_default_absl_flags()
        batches = batches.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    if prefetch_buffer_size > 0:
        batches = ThreadPrefetchIterDataset(batches, prefetch_buffer_size=prefetch_buffer_size)
    return batches


def split_inputs_and_targets(batch: dict[str, Any]) -> dict[str, Any]:
    """Model view of a batch (numpy or jax arrays, [B, L+1] each):

    inputs [B, L] = tokens[:, :-1]; targets [B, L] = tokens[:, 1:];
    segment_ids [B, L] = segment_ids[:, :-1]; loss_mask [B, L] bool: target in the same
    document as its input position (False at each EOS position, whose next token starts a
    new document).
    """
    tokens, segments = batch["tokens"], batch["segment_ids"]
    if tokens.ndim != 2 or tokens.shape != segments.shape or tokens.shape[1] < 2:
        raise ValueError(
            "batch: expected tokens and segment_ids of equal shape [B, L+1] with L >= 1, got "
            f"{tokens.shape} and {segments.shape}"
        )
    return {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": segments[:, :-1],
        "loss_mask": segments[:, :-1] == segments[:, 1:],
    }
