"""The masked loss on the accumulation path (train/core/step.py, grad_accum > 1): positions the
loss mask drops add nothing to the loss, the gradient or the target count, even when a whole
micro-batch is masked, and a batch with no scored target gives a zero loss and gradient.

Rows whose every position starts a new document have no scored target (each input's target
is the next document's first token). The model is a small bigram table: the accumulation does
not depend on the model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from train.core.step import make_train_step, masked_mean, token_losses
from tests.seeds import case_seed

VOCAB, L = 32, 7


class Bigram(nn.Module):
    @nn.compact
    def __call__(self, inputs, segment_ids):
        return nn.Dense(VOCAB)(jnp.tanh(nn.Embed(VOCAB, 8)(inputs)))


def batch_of(tokens, segments):
    return {"tokens": jnp.asarray(tokens, jnp.int32), "segment_ids": jnp.asarray(segments, jnp.int32)}


def make_case(seed):
    """4 rows: rows 0 and 2 hold documents (some targets scored), rows 1 and 3 none."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (4, L + 1))
    segments = np.ones((4, L + 1), np.int64)
    for row in (0, 2):                                   # one or two document starts
        for start in rng.choice(np.arange(2, L), int(rng.integers(1, 3)), replace=False):
            segments[row, start:] += 1
    segments[[1, 3]] = np.arange(1, L + 2)               # every position its own document
    model = Bigram()
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, L), jnp.int32),
                        jnp.ones((1, L), jnp.int32))["params"]
    return model, params, tokens, segments


def step_fn(model, grad_accum):
    optimizer = optax.sgd(1.0)                            # update = -gradient: params show it
    return jax.jit(make_train_step(model, optimizer, optax.constant_schedule(1.0), grad_accum))


def state_of(params):
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": optax.sgd(1.0).init(params)}


def test_masked_rows_add_nothing_to_the_accumulated_loss_and_gradient():
    seed = case_seed(2951)
    model, params, tokens, segments = make_case(seed)
    # grad_accum=2: micro-batch 0 = rows 0, 2 (scored), micro-batch 1 = rows 1, 3 (all masked)
    accumulating = step_fn(model, 2)   # one jitted step for both batches below
    state, metrics = accumulating(state_of(params), batch_of(tokens, segments))
    kept = batch_of(tokens[[0, 2]], segments[[0, 2]])
    alone_state, alone = step_fn(model, 1)(state_of(params), kept)
    # the oracle: the masked mean over the scored targets of rows 0 and 2, by hand
    def loss(params):
        terms = token_losses(model, params, kept)
        return masked_mean(terms["losses"], terms["mask"])
    want_loss, want_grads = jax.jit(jax.value_and_grad(loss))(params)
    count = int((segments[[0, 2], :-1] == segments[[0, 2], 1:]).sum())
    assert 0 < count < 2 * L
    assert float(metrics["target_tokens"]) == count == float(alone["target_tokens"])
    np.testing.assert_allclose(metrics["loss"], want_loss, rtol=1e-5, err_msg=f"seed {seed}")
    np.testing.assert_allclose(metrics["loss"], alone["loss"], rtol=1e-5)
    np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(want_grads), rtol=1e-5)
    for got, before, grad in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(params),
                                 jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(before - got, grad, rtol=1e-4, atol=1e-7)
    for got, want in zip(jax.tree.leaves(state["params"]),
                         jax.tree.leaves(alone_state["params"])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    # the masked rows' tokens do not matter at all
    other = tokens.copy()
    other[[1, 3]] = (other[[1, 3]] + 5) % VOCAB
    _, changed = accumulating(state_of(params), batch_of(other, segments))
    for name in ("loss", "grad_norm", "target_tokens"):
        np.testing.assert_array_equal(changed[name], metrics[name], err_msg=name)


def test_a_batch_without_scored_targets_gives_zero_loss_and_gradient():
    model, params, tokens, segments = make_case(case_seed(2952))
    state, metrics = step_fn(model, 2)(state_of(params),
                                       batch_of(tokens[[1, 3]], segments[[1, 3]]))
    assert float(metrics["target_tokens"]) == 0.0
    assert float(metrics["loss"]) == 0.0 and float(metrics["grad_norm"]) == 0.0
    for got, want in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(params)):
        np.testing.assert_array_equal(got, want)
