"""Sessions (train/core/session.py): the state and its abstract twin, the non-finite guard (its
rule, its select fused into the update in the compiled step, and fit stopping on non-finite
parameters before saving them), range errors, gradient accumulation against the whole batch,
and train.grad_accum reaching the train step."""

import re
import types
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.seeds import case_seed
from tests.train import tiny_run
from tests.train.overflowing_update import overflow_parameters_after
from train.core.presets import load_config
from train.core.session import (RangeCheckError, all_finite, build_session, guard_nonfinite,
                                local_batch_size, raise_range_errors)

TINY = tiny_run.TINY


class Bigram(nn.Module):
    """A small bigram table: logits [B, L, 64]; on_call(rows) at each call, if given."""
    on_call: Callable[[int], None] | None = None

    @nn.compact
    def __call__(self, inputs, segment_ids):
        if self.on_call is not None:
            self.on_call(inputs.shape[0])
        hidden = nn.Embed(64, 8)(inputs) * segment_ids[..., None]
        return nn.Dense(64)(jnp.tanh(hidden))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_run.write_corpus(tmp_path_factory.mktemp("corpus"), seed=case_seed(1203))


def test_gradient_accumulation_matches_the_whole_batch():
    """Same loss, gradient norm and updated parameters with 4 micro-batches as with one batch
    of all rows, with documents (and so target counts) of different lengths per row. The
    model is a small bigram table (the accumulation does not depend on the model)."""
    from train.core.optimizer import build_optimizer, learning_rate_schedule
    from train.core.step import make_train_step

    traced_rows = []                                            # rows per model call
    config = load_config(None, TINY)
    model = Bigram(traced_rows.append)
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


@pytest.mark.parametrize("loss, grad_norm, kept", [
    (1.0, 2.0, False), (float("nan"), 2.0, True), (1.0, float("inf"), True),
    (float("-inf"), float("nan"), True)])
def test_a_non_finite_loss_or_gradient_norm_keeps_params_and_optimizer_state(
        loss, grad_norm, kept):
    """The rule is the step's loss and gradient norm alone: an update is applied whenever both
    are finite (the parameters are checked by fit, at log points and saves)."""
    def step(state, batch):
        new = {"step": state["step"] + 1, "params": {"w": state["params"]["w"] + 1.0},
               "opt_state": {"m": state["opt_state"]["m"] + 1.0}}
        return new, {"loss": jnp.float32(loss), "grad_norm": jnp.float32(grad_norm)}

    state = {"step": jnp.int32(3), "params": {"w": jnp.ones(2)}, "opt_state": {"m": jnp.zeros(2)}}
    new, metrics = jax.jit(guard_nonfinite(step))(state, None)
    assert int(new["step"]) == 4                        # the step advances either way
    expected_w, expected_m = (1.0, 0.0) if kept else (2.0, 1.0)
    np.testing.assert_array_equal(new["params"]["w"], [expected_w] * 2)
    np.testing.assert_array_equal(new["opt_state"]["m"], [expected_m] * 2)
    assert float(metrics["nonfinite"]) == float(kept)
    assert "nonfinite_params" not in metrics


def test_all_finite_is_exact_and_skips_integer_leaves():
    tree = {"a": jnp.zeros((3, 5)), "count": jnp.int32(7), "b": jnp.ones(4, jnp.bfloat16)}
    assert bool(all_finite(tree)) and bool(all_finite({"count": jnp.int32(1)}))
    for leaf, value in (("a", jnp.nan), ("a", -jnp.inf), ("b", jnp.inf)):
        broken = {**tree, leaf: tree[leaf].at[-1].set(value)}     # one element of one leaf
        assert not bool(jax.jit(all_finite)(broken)), (leaf, value)


def _hlo_computations(text: str) -> dict[str, list[str]]:
    """Name -> instruction lines of each computation of a compiled module's HLO text;
    "__entry__" -> the entry computation's name."""
    computations, name = {}, None
    for line in text.splitlines():
        header = re.match(r"^(ENTRY )?%(\S+) .*\{$", line)
        if header:
            name = header.group(2)
            computations[name] = []
            if header.group(1):
                computations["__entry__"] = name
        elif line == "}":
            name = None
        elif name is not None:
            computations[name].append(line.strip())
    return computations


def test_the_guards_select_fuses_into_the_update():
    """The compiled guarded step (CPU, a bigram model, AdamW with clipping): the guard reads
    no updated parameter (no is-finite over an array of a parameter's shape), and every new
    parameter and optimizer-state leaf is written by one fusion that computes the update and
    selects it, no select pass of its own. Under the former rule (a predicate over the
    updated parameters) both fail: per-leaf is-finite reductions, and fusions that only
    select between the materialised update and the old leaf. This is the CPU compiler's
    structure, not a GPU profile; CPU XLA may also recompute an update inside a select
    fusion, which this test does not rule out."""
    from train.core.optimizer import build_optimizer, learning_rate_schedule
    from train.core.step import make_train_step

    config = load_config(None, TINY)
    model = Bigram()
    tokens = jnp.zeros((2, 9), jnp.int32)
    batch = {"tokens": tokens, "segment_ids": jnp.ones_like(tokens)}
    params = model.init(jax.random.PRNGKey(0), tokens[:, :-1], tokens[:, :-1])["params"]
    optimizer = build_optimizer(config.optim, 10)
    state = {"step": jnp.zeros((), jnp.int32), "params": params,
             "opt_state": optimizer.init(params)}
    step = guard_nonfinite(make_train_step(model, optimizer,
                                           learning_rate_schedule(config.optim, 10)))
    text = jax.jit(step, donate_argnums=0).lower(state, batch).compile().as_text()

    leaf_shapes = {tuple(x.shape) for x in jax.tree.leaves(params)}
    checked = {tuple(int(d) for d in dims.split(",") if d)
               for dims in re.findall(r"= pred\[([0-9,]*)\]\S* is-finite\(", text)}
    assert () in checked                                # the loss and gradient norm
    assert not checked & leaf_shapes, checked

    computations = _hlo_computations(text)
    entry = computations[computations["__entry__"]]
    defined = {m.group(1): line for line in entry
               if (m := re.match(r"^(?:ROOT )?%(\S+) = ", line))}
    root = next(line for line in entry if line.startswith("ROOT"))
    writers = [defined[name] for name in re.findall(r"%([\w.\-]+)", root.split(" tuple(", 1)[1])]
    updated = [line for line in writers if re.match(r"^%\S+ = f32\[[0-9]", line)]
    assert len(updated) == 3 * len(jax.tree.leaves(params))    # params, Adam's mu and nu
    for line in updated:
        assert " fusion(" in line, line
        body = computations[re.search(r"calls=%([\w.\-]+)", line).group(1)]
        assert any(" select(" in op for op in body), line
        assert any(re.search(r" (add|subtract|multiply|divide)\(", op) for op in body), line


def test_fit_stops_when_an_update_makes_the_parameters_non_finite(
        tmp_path, corpus, monkeypatch):
    """Step 4's update makes the parameters inf while every step's loss and gradient norm stay
    finite: the check before the step-4 save stops the run in both modes (skip cannot undo an
    applied update), naming steps 3-4 and checkpoint 2, and nothing after step 2 is saved."""
    from train.core.fit import DivergenceError, fit
    from train.core.runs import checkpoint_steps

    overflow_parameters_after(monkeypatch, 3)
    for mode in ("skip", "stop"):
        run_dir = tmp_path / mode
        config = load_config("tiny_softmax", [
            *TINY, f"data.source={corpus}", "train.steps=6", "train.checkpoint_every=2",
            "train.log_every=5", "train.tensorboard=false", f"train.on_nonfinite={mode}"])
        with pytest.raises(DivergenceError, match=r"^training diverged: non-finite parameters "
                           r"after an update at steps 3-4 .*skip cannot undo.*; nothing after "
                           r"checkpoint step 2 was saved\. "):
            fit(config, run_dir)
        assert checkpoint_steps(run_dir) == [2], mode


def test_a_failed_range_check_is_a_range_check_error_with_its_first_line():
    def checked(message):
        error = types.SimpleNamespace(get=lambda: message)
        return lambda state, batch: (error, ("state", "metrics"))

    assert raise_range_errors(checked(None))(None, None) == ("state", "metrics")
    with pytest.raises(RangeCheckError, match=r"^train.check_ranges: beta: expected 0 <= beta "
                                              r"<= 1$"):
        raise_range_errors(checked("beta: expected 0 <= beta <= 1\n(traceback)"))(None, None)

