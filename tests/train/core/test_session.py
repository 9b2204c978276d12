"""Sessions (train/core/session.py): the state and its abstract twin, the non-finite guard,
range errors, gradient accumulation against the whole batch, and train.grad_accum reaching the
train step."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.seeds import case_seed
from tests.train import tiny_run
from train.core.presets import load_config
from train.core.session import (RangeCheckError, build_session, guard_nonfinite,
                                local_batch_size, raise_range_errors)

TINY = tiny_run.TINY


def test_gradient_accumulation_matches_the_whole_batch():
    """Same loss, gradient norm and updated parameters with 4 micro-batches as with one batch
    of all rows, with documents (and so target counts) of different lengths per row. The
    model is a small bigram table (the accumulation does not depend on the model)."""
    import flax.linen as nn

    from train.core.optimizer import build_optimizer, learning_rate_schedule
    from train.core.step import make_train_step

    traced_rows = []                                            # rows per model call

    class Bigram(nn.Module):
        @nn.compact
        def __call__(self, inputs, segment_ids):
            traced_rows.append(inputs.shape[0])
            hidden = nn.Embed(64, 8)(inputs) * segment_ids[..., None]
            return nn.Dense(64)(jnp.tanh(hidden))

    config = load_config(None, TINY)
    model = Bigram()
    rng = np.random.default_rng(case_seed(1201))
    tokens = jnp.asarray(rng.integers(0, 64, (8, 9)), jnp.int32)
    segments = np.ones((8, 9), np.int32)
    for row in range(8):                                        # 0-3 document starts per row
        for start in sorted(rng.choice(np.arange(2, 8), int(rng.integers(0, 4)), False)):
            segments[row, start:] += 1
    batch = {"tokens": tokens, "segment_ids": jnp.asarray(segments)}
    params = model.init(jax.random.PRNGKey(case_seed(1202)), tokens[:1, :-1],
                        batch["segment_ids"][:1, :-1])["params"]
    optimizer = build_optimizer(config.optim, 10)
    schedule = learning_rate_schedule(config.optim, 10)
    state = {"step": jnp.zeros((), jnp.int32), "params": params,
             "opt_state": optimizer.init(params)}
    whole = jax.jit(make_train_step(model, optimizer, schedule))(state, batch)
    traced_rows.clear()
    accumulated = jax.jit(make_train_step(model, optimizer, schedule, 4))(state, batch)
    assert traced_rows and set(traced_rows) == {2}             # the model saw micro-batches
    for name in ("loss", "grad_norm", "target_tokens"):
        np.testing.assert_allclose(accumulated[1][name], whole[1][name], rtol=2e-6, err_msg=name)
    for got, want in zip(jax.tree.leaves(accumulated[0]["params"]),
                         jax.tree.leaves(whole[0]["params"])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="grad_accum"):
        make_train_step(model, optimizer, schedule, 0)


def test_grad_accum_option_reaches_the_train_step(monkeypatch):
    import train.core.session

    original, passed = train.core.session.make_train_step, []

    def recording(*args):
        passed.append(args[3:])
        return original(*args)

    monkeypatch.setattr(train.core.session, "make_train_step", recording)
    build_session(load_config(None, [*TINY, "train.grad_accum=2"]), 257)
    assert passed == [(2,)]


def test_the_abstract_state_describes_the_initial_state():
    session = build_session(load_config(None, TINY), 257)
    state = session.init_state()
    assert set(state) == {"step", "params", "opt_state"} and int(state["step"]) == 0
    flat, abstract = jax.tree.leaves(state), jax.tree.leaves(session.abstract_state)
    assert [(x.shape, x.dtype) for x in flat] == [(a.shape, a.dtype) for a in abstract]
    again = session.init_state()                       # the same seed, the same parameters
    for x, y in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(again["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert session.state_shardings["params"]["embed"]["embedding"].mesh == session.mesh
    assert local_batch_size(session.config) == 2       # one process: the whole batch


@pytest.mark.parametrize("loss, grad_norm, update, kept", [
    (1.0, 2.0, 1.0, False), (float("nan"), 2.0, 1.0, True), (1.0, float("inf"), 1.0, True),
    (1.0, 2.0, float("inf"), True)])
def test_a_non_finite_step_keeps_params_and_optimizer_state(loss, grad_norm, update, kept):
    def step(state, batch):
        new = {"step": state["step"] + 1, "params": {"w": state["params"]["w"] + update},
               "opt_state": {"m": state["opt_state"]["m"] + 1.0}}
        return new, {"loss": jnp.float32(loss), "grad_norm": jnp.float32(grad_norm)}

    state = {"step": jnp.int32(3), "params": {"w": jnp.ones(2)}, "opt_state": {"m": jnp.zeros(2)}}
    new, metrics = guard_nonfinite(step)(state, None)
    assert int(new["step"]) == 4                        # the step advances either way
    expected_w, expected_m = (1.0, 0.0) if kept else (2.0, 1.0)
    np.testing.assert_array_equal(new["params"]["w"], [expected_w] * 2)
    np.testing.assert_array_equal(new["opt_state"]["m"], [expected_m] * 2)
    assert float(metrics["nonfinite"]) == float(kept)
    assert float(metrics["nonfinite_params"]) == float(update != 1.0)


def test_a_failed_range_check_is_a_range_check_error_with_its_first_line():
    def checked(message):
        error = types.SimpleNamespace(get=lambda: message)
        return lambda state, batch: (error, ("state", "metrics"))

    assert raise_range_errors(checked(None))(None, None) == ("state", "metrics")
    with pytest.raises(RangeCheckError, match=r"^train.check_ranges: beta: expected 0 <= beta "
                                              r"<= 1$"):
        raise_range_errors(checked("beta: expected 0 <= beta <= 1\n(traceback)"))(None, None)

