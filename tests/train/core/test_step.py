"""The training step on hand-built packed batches, for every mixer kind.

Batch (seq_len L = 11, rows of L + 1 = 12 tokens, EOS = 256, as the packer lays them out):
    row 0   doc A: 5 text tokens + EOS (index 0..5) | doc B: 4 + EOS (6..10) | doc C starts (11)
    row 1   doc D: 3 + EOS (0..3) | doc E: 8 tokens, continued in the next row (4..11)
    segment_ids  1 for the row's first piece, 2 for the next, ... (train/data/pipeline.py)
    loss mask    every input position except those holding an EOS: row 0 at 5 and 10,
                 row 1 at 3 (written out below by hand, not derived from the segment ids)

Token 11 of row 0 (doc C's first token) is only ever a target, of the EOS at 10: masked.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from train.core.model import build_model
from train.core.optimizer import build_optimizer, learning_rate_schedule
from train.core.presets import load_config
from train.core.step import make_eval_step, make_train_step, token_losses

EOS, VOCAB, L = 256, 257, 11
DOC_LENGTHS = ([6, 5, 1], [4, 8])             # per row, in tokens (EOS included)
SEGMENT_IDS = np.array([[1] * 6 + [2] * 5 + [3], [1] * 4 + [2] * 8], np.int32)
LOSS_MASK = np.ones((2, L), bool)
LOSS_MASK[0, [5, 10]] = LOSS_MASK[1, 3] = False
POSITIONS = np.array([list(range(6)) + list(range(5)), list(range(4)) + list(range(7))])
DOC_A_TEXT, DOC_B = (0, slice(1, 5)), (0, slice(6, 11))          # (row, input positions)
DOC_D_TEXT, DOC_E = (1, slice(0, 3)), (1, slice(4, 11))

MIXERS = {
    "fpa": ["attention.kind=fpa"],
    "fox": ["attention.kind=fox"],
    "softmax": ["attention.kind=softmax", "attention.position=rope"],
    "selective": ["attention.kind=selective", "attention.position=rope"],
    "dcp": ["attention.kind=dcp"],
    "gdn": ["model.pattern=G"],
}


def packed_batch(seed):
    """Random text tokens, EOS where the documents end; segment ids as the packer writes them."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, EOS, (2, L + 1)).astype(np.int32)
    tokens[0, [5, 10]] = tokens[1, 3] = EOS
    return {"tokens": tokens, "segment_ids": SEGMENT_IDS.copy()}


def test_hand_built_batch_is_what_the_packer_produces():
    starts = [np.cumsum([0] + lengths[:-1]) for lengths in DOC_LENGTHS]
    for row, row_starts in enumerate(starts):
        assert np.array_equal(np.unique(SEGMENT_IDS[row], return_index=True)[1], row_starts)
    assert np.array_equal(np.asarray(packed_batch(0)["tokens"])[:, :-1] == EOS, ~LOSS_MASK)


def config_for(kind):
    return load_config(None, ["model.d_model=16", "model.num_layers=1", "attention.num_heads=2",
                              "attention.head_dim=8", "gdn.num_heads=2", "gdn.head_dim=8",
                              "data.seq_len=11", "optim.name=sgd", "optim.schedule=constant",
                              "optim.warmup_steps=0", "optim.clip_norm=0", *MIXERS[kind]])


@functools.cache
def model_and_params(kind, seed=0):
    """The model and random params of its init's shapes (no init compile)."""
    model = build_model(config_for(kind), VOCAB)
    dummy = jnp.zeros((1, 4), jnp.int32)
    shapes = nn.meta.unbox(jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), dummy, jnp.ones_like(dummy))["params"]))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda x: jnp.asarray(0.5 * rng.standard_normal(x.shape), x.dtype), shapes)
    return model, params


@functools.cache
def trainer_view(kind):
    """jit(token_losses) of the trainer, also returning the segment_ids each mixer received."""
    model, _ = model_and_params(kind)

    def run(params, batch):
        seen = []

        def record_mixer_inputs(next_fun, args, kwargs, context):
            if context.method_name == "__call__" and context.module.name == "mixer":
                seen.append(kwargs["segment_ids"])
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(record_mixer_inputs):
            terms = token_losses(model, params, batch)
        return terms, seen

    return jax.jit(run)


def hand_losses(logits, tokens):
    """Cross-entropy of each position's logits at the next token, float64 numpy."""
    logits = np.asarray(logits, np.float64)
    log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    targets = np.asarray(tokens)[:, 1:]
    return log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]


def hand_masked_mean(logits, tokens):
    losses = hand_losses(logits, tokens)
    return float((losses * LOSS_MASK).sum() / LOSS_MASK.sum())


def changed(batch, row, positions, seed):
    tokens = np.array(batch["tokens"])
    rng = np.random.default_rng(seed)
    old = tokens[row, positions]
    tokens[row, positions] = (old + 1 + rng.integers(0, EOS - 1, old.shape)) % EOS
    return {**batch, "tokens": tokens}


@pytest.mark.parametrize("kind", list(MIXERS))
def test_trainer_losses_on_a_packed_batch(kind):
    """Per mixer, through the trainer's own loss path (train/core/step.py token_losses):
    segment_ids reach the mixer as packed; per-position losses and mask are the hand-computed
    ones; a document's logits and loss terms do not depend on another document's tokens; the
    masked target after an EOS does not change the loss."""
    model, params = model_and_params(kind)
    run = trainer_view(kind)
    batch = packed_batch(seed=len(kind))
    terms, seen = run(params, batch)
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], SEGMENT_IDS[:, :-1])
    np.testing.assert_array_equal(terms["mask"], LOSS_MASK.astype(np.float32))
    np.testing.assert_allclose(terms["losses"], hand_losses(terms["logits"], batch["tokens"]),
                               rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(terms["logits"]))

    # the first document of each row changes: the second's logits and loss terms do not
    for first, second in ((DOC_A_TEXT, DOC_B), (DOC_D_TEXT, DOC_E)):
        other, _ = run(params, changed(batch, *first, seed=7))
        for name in ("logits", "losses"):
            np.testing.assert_allclose(other[name][second], terms[name][second],
                                       rtol=1e-5, atol=1e-5, err_msg=f"{kind} {name}")
        row, text = first
        after = slice(text.start + 1, text.stop)
        assert np.abs(other["logits"][row, after] - terms["logits"][row, after]).max() > 1e-4

    # doc C's first token is only the (masked) target of the EOS before it
    masked_target_changed = changed(batch, 0, [L], seed=8)
    other, _ = run(params, masked_target_changed)
    np.testing.assert_array_equal(other["logits"], terms["logits"])
    mean = hand_masked_mean(terms["logits"], batch["tokens"])
    for result in (terms, other):
        np.testing.assert_allclose(
            float((result["losses"] * result["mask"]).sum() / result["mask"].sum()), mean,
            rtol=1e-5)
    assert abs(float(other["losses"][0, L - 1] - terms["losses"][0, L - 1])) > 1e-6


@functools.cache
def jitted_steps(kind):
    model, _ = model_and_params(kind)
    config = config_for(kind)
    optimizer = build_optimizer(config.optim, 10)
    train_step = make_train_step(model, optimizer, learning_rate_schedule(config.optim, 10))
    return optimizer, jax.jit(train_step), jax.jit(make_eval_step(model, L, 3))


def test_train_and_eval_steps_use_the_masked_mean(kind="softmax"):
    """The train step's loss, and the eval step's sums (overall and per position bucket), are
    the masked means by hand, and ignore the masked target after an EOS. (The reduction does
    not depend on the mixer; each mixer's per-position terms are checked above.)"""
    model, params = model_and_params(kind)
    optimizer, train_step, eval_step = jitted_steps(kind)
    batch = packed_batch(seed=3)
    terms, _ = trainer_view(kind)(params, batch)
    losses = hand_losses(terms["logits"], batch["tokens"])
    state = {"step": jnp.int32(0), "params": params, "opt_state": optimizer.init(params)}
    masked_target_changed = changed(batch, 0, [L], seed=9)
    for candidate in (batch, masked_target_changed):
        _, metrics = train_step(jax.tree.map(jnp.copy, state), candidate)
        np.testing.assert_allclose(float(metrics["loss"]),
                                   (losses * LOSS_MASK).sum() / LOSS_MASK.sum(), rtol=1e-5)
        assert float(metrics["target_tokens"]) == LOSS_MASK.sum()

        sums = jax.device_get(eval_step(params, candidate))
        np.testing.assert_allclose(sums["loss_sum"], (losses * LOSS_MASK).sum(), rtol=1e-5)
        assert float(sums["count"]) == LOSS_MASK.sum()
        bucket = np.minimum(POSITIONS // 4, 2)   # width ceil(11 / 3) = 4
        for b in range(3):
            where = LOSS_MASK & (bucket == b)
            np.testing.assert_allclose(sums["bucket_loss_sum"][b], losses[where].sum(), rtol=1e-5)
            assert float(sums["bucket_count"][b]) == where.sum()
