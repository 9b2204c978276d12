"""Per-document held-out losses: the eval step's sums per (row, segment) on the hand-built
packed batch of core/test_step.py, and `evaluate`'s flat list of document pieces in batch, row,
segment order (what the language-model comparison pairs across models)."""

import jax
import numpy as np

from tests.train.core.test_step import (LOSS_MASK, SEGMENT_IDS, hand_losses, jitted_steps,
                                        model_and_params, packed_batch, trainer_view)
from tests.train.tiny_run import copy_run
from train.core.evaluate import evaluate_run

KIND = "softmax"


def hand_piece_sums(batch):
    """{(row, segment): (loss sum, scored tokens)} by hand from the logits."""
    _, params = model_and_params(KIND)
    terms, _ = trainer_view(KIND)(params, batch)
    losses = hand_losses(terms["logits"], batch["tokens"])
    pieces = {}
    for row in range(2):
        for segment in np.unique(SEGMENT_IDS[row, :-1]):
            where = LOSS_MASK[row] & (SEGMENT_IDS[row, :-1] == segment)
            pieces[row, int(segment)] = (losses[row][where].sum(), int(where.sum()))
    return pieces


def test_eval_step_sums_each_document_piece():
    _, params = model_and_params(KIND)
    _, _, eval_step = jitted_steps(KIND)
    batch = packed_batch(seed=5)
    sums = jax.device_get(eval_step(params, batch))
    assert sums["document_loss_sum"].shape == sums["document_count"].shape == (2, 12)
    expected = hand_piece_sums(batch)
    for (row, segment), (loss, count) in expected.items():
        np.testing.assert_allclose(sums["document_loss_sum"][row, segment], loss, rtol=1e-5)
        assert sums["document_count"][row, segment] == count
    others = np.ones((2, 12), bool)
    for row, segment in expected:
        others[row, segment] = False
    assert not sums["document_count"][others].any()
    np.testing.assert_allclose(sums["document_loss_sum"].sum(), sums["loss_sum"], rtol=1e-5)


def test_evaluate_lists_document_pieces_that_add_up_to_the_mean(tiny_trained_run, tmp_path):
    run_dir = copy_run(tiny_trained_run, tmp_path / "run")
    plain = evaluate_run(run_dir, num_batches=2)
    pieces = evaluate_run(run_dir, num_batches=2, per_document=True)
    assert "document_loss_sum" not in plain
    sums, tokens = np.array(pieces["document_loss_sum"]), np.array(pieces["document_tokens"])
    assert len(sums) == len(tokens) >= 2 and (tokens > 0).all()
    assert tokens.sum() == pieces["tokens"] == plain["tokens"]
    np.testing.assert_allclose(sums.sum() / tokens.sum(), plain["loss"], rtol=1e-5)
