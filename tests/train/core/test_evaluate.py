"""Held-out evaluation (train/core/evaluate.py): the totals over batches, the position buckets
and the document pieces against values computed by hand, and the argument checks."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from train.core.evaluate import _eval_config, evaluate, evaluate_run
from train.core.presets import load_config
from train.core.sharding import batch_sharding, make_mesh

# two eval batches' sums as the eval step returns them (train/core/step.py)
SUMS = [
    {"loss_sum": 6.0, "count": 4.0, "bucket_loss_sum": [1.0, 5.0, 0.0],
     "bucket_count": [1.0, 3.0, 0.0], "document_loss_sum": [[1.5, 0.0], [2.0, 2.5]],
     "document_count": [[2, 0], [1, 1]]},
    {"loss_sum": 3.0, "count": 2.0, "bucket_loss_sum": [2.0, 0.5, 0.0],
     "bucket_count": [1.0, 1.0, 0.0], "document_loss_sum": [[0.5, 0.0], [0.0, 0.0]],
     "document_count": [[1, 0], [0, 0]]},
]


def scripted_session():
    mesh = make_mesh((1, 1, 1))
    calls = iter(SUMS)

    def eval_step(params, batch):
        assert batch["tokens"].shape == (2, 11)
        return {name: jnp.asarray(value) for name, value in next(calls).items()}

    config = load_config(None, ["data.seq_len=10", "data.batch_size=2",
                                "train.position_buckets=3"])
    return types.SimpleNamespace(mesh=mesh, batch_sharding=batch_sharding(mesh), config=config,
                                 eval_step=eval_step)


def batches():
    while True:
        yield {"tokens": np.zeros((2, 11), np.int32), "segment_ids": np.ones((2, 11), np.int32)}


def test_totals_buckets_and_document_pieces_by_hand():
    result = evaluate(scripted_session(), None, batches(), num_batches=2, per_document=True)
    assert result["loss"] == pytest.approx(9.0 / 6.0)
    assert result["tokens"] == 6
    assert result["position_bucket_start"] == [0, 4, 8]          # width ceil(10 / 3) = 4
    assert result["position_loss"] == [pytest.approx(3.0 / 2.0), pytest.approx(5.5 / 4.0), None]
    assert result["position_tokens"] == [2, 4, 0]
    # pieces with scored tokens, batch by batch, row by row, segment by segment
    assert result["document_loss_sum"] == [1.5, 2.0, 2.5, 0.5]
    assert result["document_tokens"] == [2, 1, 1, 1]


def test_without_per_document_there_are_no_pieces():
    result = evaluate(scripted_session(), None, batches(), num_batches=1)
    assert "document_loss_sum" not in result and result["tokens"] == 4


def test_another_batch_size_evaluates_in_one_batch():
    config = load_config(None, ["data.batch_size=8", "train.grad_accum=4", "data.seq_len=64"])
    same = _eval_config(config, None, None)
    assert same == config
    other = _eval_config(config, 128, 2)
    assert (other.data.seq_len, other.data.batch_size, other.train.grad_accum) == (128, 2, 1)
    assert _eval_config(config, 32, None).train.grad_accum == 4


@pytest.mark.parametrize("keyword", ["seq_len", "num_batches", "batch_size"])
def test_sizes_below_one_are_refused_before_anything_is_read(tmp_path, keyword):
    with pytest.raises(ValueError, match=f"^{keyword}: expected an int >= 1, got 0$"):
        evaluate_run(tmp_path / "no_run", **{keyword: 0})
