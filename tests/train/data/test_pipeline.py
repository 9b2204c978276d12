"""The data pipeline (train/data/pipeline.py): packing, splits, sharding over processes,
iterator state, argument checks."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.data.letter_corpus import LETTERS, letter_corpus
from train.checkpoint.iterator_state import decode_iterator_state, encode_iterator_state
from train.checkpoint.manager import Checkpointer
from train.data.pipeline import (make_dataset, process_document_indices, split_document_indices,
                                 split_inputs_and_targets)
from train.data.sources import resolve_source
from train.data.tokenizer import ByteTokenizer


BYTE = ByteTokenizer()


def _documents_seen(batches):
    """Letters (= documents) present in the tokens of `batches`."""
    seen = set()
    for batch in batches:
        values = np.unique(batch["tokens"])
        seen |= {chr(v) for v in values if v < 256 and chr(v) in LETTERS}
    return seen


def _take(iterator, count):
    return [next(iterator) for _ in range(count)]


def _assert_same_batches(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
        np.testing.assert_array_equal(a["segment_ids"], b["segment_ids"])


@pytest.mark.parametrize("seq_len,batch_size,seed", [(37, 3, 11), (1, 2, 5), (200, 1, 23)])
def test_rows_shapes_and_segment_ids(seq_len, batch_size, seed):
    dataset = make_dataset(source="stdlib", tokenizer=BYTE, seq_len=seq_len,
                           batch_size=batch_size, seed=seed, max_documents=40)
    iterator = iter(dataset)
    for batch in _take(iterator, 6):
        assert set(batch) == {"tokens", "segment_ids"}
        for value in batch.values():
            assert value.shape == (batch_size, seq_len + 1) and value.dtype == np.int32
        tokens, segments = batch["tokens"], batch["segment_ids"]
        assert tokens.min() >= 0 and tokens.max() < BYTE.vocab_size
        assert (segments[:, 0] == 1).all()
        steps = np.diff(segments, axis=1)
        assert np.isin(steps, [0, 1]).all()
        # A new segment starts exactly after each EOS token (no padding in an endless stream).
        np.testing.assert_array_equal(steps == 1, tokens[:, :-1] == BYTE.eos_id)
        model = split_inputs_and_targets(batch)
        assert model["inputs"].shape == (batch_size, seq_len)
        np.testing.assert_array_equal(model["targets"], tokens[:, 1:])
        np.testing.assert_array_equal(model["loss_mask"], tokens[:, :-1] != BYTE.eos_id)
    iterator.close()


def test_decoded_rows_are_source_text():
    corpus = resolve_source("stdlib", max_documents=30)
    texts = [corpus.read_text(i) for i in range(len(corpus.keys))]
    dataset = make_dataset(source="stdlib", tokenizer=BYTE, seq_len=300, batch_size=2, seed=7,
                           max_documents=30)
    iterator = iter(dataset)
    checked = 0
    for batch in _take(iterator, 8):
        for tokens, segments in zip(batch["tokens"], batch["segment_ids"]):
            for segment in np.unique(segments):
                piece = tokens[segments == segment]
                text = BYTE.decode(piece[piece != BYTE.eos_id])
                if len(text) >= 20 and "\ufffd" not in text:  # a cut may split a UTF-8 char
                    assert any(text in source for source in texts), text[:80]
                    checked += 1
                if piece[-1] == BYTE.eos_id and segment > 1:  # a whole document
                    assert BYTE.decode(piece) in texts
    assert checked > 10
    iterator.close()


def test_whole_documents_round_trip(tmp_path):
    texts = letter_corpus(tmp_path, 30, seed=3)
    dataset = make_dataset(source=str(tmp_path), tokenizer=BYTE, seq_len=120, batch_size=2,
                           seed=4, split="all", num_epochs=1, shuffle=False)
    decoded = []
    for batch in dataset:
        for tokens, segments in zip(batch["tokens"], batch["segment_ids"]):
            assert segments[-1] > 0  # finite stream: the incomplete tail row is dropped
            decoded.append(BYTE.decode(tokens))
    stream = "".join(decoded)
    expected = "".join(texts[key] for key in sorted(texts))  # unshuffled: sorted order
    assert len(stream) > 0 and expected.startswith(stream)


def test_heldout_split_is_disjoint_and_stable(tmp_path):
    texts = letter_corpus(tmp_path, 60, seed=9)
    corpus = resolve_source(str(tmp_path))
    train = split_document_indices(corpus.keys, split="train", heldout_fraction=0.2)
    held = split_document_indices(corpus.keys, split="eval", heldout_fraction=0.2)
    assert held and not set(train) & set(held)
    assert sorted(train + held) == list(range(len(texts)))
    assert held == split_document_indices(corpus.keys, split="eval", heldout_fraction=0.2)
    assert len(split_document_indices(corpus.keys, split="eval", heldout_fraction=1e-9)) == 1

    letters = {key: text[0] for key, text in texts.items()}
    eval_letters = {letters[corpus.keys[i]] for i in held}
    eval_stream = make_dataset(source=str(tmp_path), tokenizer=BYTE, seq_len=16, batch_size=2,
                               split="eval", heldout_fraction=0.2, num_epochs=1)
    train_stream = make_dataset(source=str(tmp_path), tokenizer=BYTE, seq_len=16, batch_size=2,
                                split="train", heldout_fraction=0.2, seed=1, num_epochs=1)
    assert _documents_seen(eval_stream) <= eval_letters
    assert not _documents_seen(train_stream) & eval_letters


def test_processes_see_disjoint_documents(tmp_path):
    letter_corpus(tmp_path, 50, seed=12)
    corpus = resolve_source(str(tmp_path))
    seen, indices = [], []
    for process_index in range(2):
        indices.append(set(process_document_indices(
            corpus, split="train", heldout_fraction=0.1,
            process_index=process_index, process_count=2)))
        dataset = make_dataset(source=str(tmp_path), tokenizer=BYTE, seq_len=8, batch_size=1,
                               heldout_fraction=0.1, seed=2, process_index=process_index,
                               process_count=2, num_epochs=1, shuffle_window=1)
        seen.append(_documents_seen(dataset))
    assert not indices[0] & indices[1]
    assert not seen[0] & seen[1]
    all_train = split_document_indices(corpus.keys, split="train", heldout_fraction=0.1)
    assert len(seen[0] | seen[1]) >= len(all_train) - 2  # tail rows may be dropped


@pytest.mark.parametrize("seed", [0, 17])
def test_iterator_state_reproduces_stream(seed):
    dataset = make_dataset(source="stdlib", tokenizer=BYTE, seq_len=64, batch_size=2, seed=seed,
                           max_documents=25, shuffle_window=5)
    iterator = iter(dataset)
    for offset in (0, 1, 3, 4, 9):
        _take(iterator, offset)
        state = decode_iterator_state(encode_iterator_state(iterator.get_state()))
        expected = _take(iterator, 4)
        fresh = iter(dataset)
        fresh.set_state(state)
        _assert_same_batches(_take(fresh, 4), expected)
        fresh.close()
    iterator.close()


def test_worker_processes_stream_restores_exactly():
    dataset = make_dataset(source="stdlib", tokenizer=BYTE, seq_len=32, batch_size=2, seed=13,
                           max_documents=12, worker_count=1)
    iterator = iter(dataset)
    _take(iterator, 3)
    state = decode_iterator_state(encode_iterator_state(iterator.get_state()))
    expected = _take(iterator, 3)
    iterator.close()
    fresh = iter(dataset)
    fresh.set_state(state)
    _assert_same_batches(_take(fresh, 3), expected)
    fresh.close()


def test_iterator_state_survives_document_boundary_states(tmp_path):
    # Rows that end exactly at a document end leave the packer with no remainder: the state
    # then holds (-1, -1) slices, which must stay tuples through serialisation.
    for i in range(12):
        (tmp_path / f"d{i:02d}.txt").write_text(LETTERS[i] * 7)  # 7 bytes + EOS = one row of 8
    dataset = make_dataset(source=str(tmp_path), tokenizer=BYTE, seq_len=7, batch_size=1,
                           split="all", seed=3, shuffle_window=1)
    iterator = iter(dataset)
    _take(iterator, 5)
    state = iterator.get_state()
    assert "(-1, -1)" in str(state)
    expected = _take(iterator, 6)
    fresh = iter(dataset)
    fresh.set_state(decode_iterator_state(encode_iterator_state(state)))
    _assert_same_batches(_take(fresh, 6), expected)


def test_iterator_state_through_checkpointer(tmp_path):
    dataset = make_dataset(source="stdlib", tokenizer=BYTE, seq_len=48, batch_size=3, seed=29,
                           max_documents=20)
    iterator = iter(dataset)
    _take(iterator, 7)
    with Checkpointer(tmp_path / "ckpt", save_interval_steps=1) as checkpointer:
        checkpointer.save(7, state={"step": jnp.int32(7)}, data_iterator=iterator)
        checkpointer.wait_until_finished()
    expected = _take(iterator, 5)
    iterator.close()

    fresh = iter(dataset)
    with Checkpointer(tmp_path / "ckpt") as checkpointer:
        restored = checkpointer.restore_latest({"step": jnp.int32(0)}, data_iterator=fresh)
    assert restored.step == 7 and int(restored.state["step"]) == 7
    _assert_same_batches(_take(fresh, 5), expected)
    fresh.close()


@pytest.mark.parametrize("kwargs,match", [
    ({"seq_len": 0}, "seq_len"),
    ({"batch_size": -1}, "batch_size"),
    ({"split": "test"}, "split"),
    ({"heldout_fraction": 1.0}, "heldout_fraction"),
    ({"process_index": 2, "process_count": 2}, "process_index"),
    ({"num_epochs": 0}, "num_epochs"),
    ({"source": "/nonexistent/*.txt"}, "source"),
])
def test_make_dataset_rejects_bad_arguments(kwargs, match):
    arguments = dict(source="stdlib", tokenizer=BYTE, seq_len=8, batch_size=2, max_documents=5)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_dataset(**arguments)
