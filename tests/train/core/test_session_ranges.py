"""Op argument ranges and the checked train step (train/core/session.py): the gated delta rule's
g <= 0, 0 <= beta <= 1 and unit keys, FPA's beta > 0. Concrete arguments are checked at once
(ValueError naming the argument); inside jit only in checked mode (`checked_ranges` +
checkify), which the trainer turns on with train.check_ranges."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from fpa_jax import fpa_attention
from gdn_jax import gated_delta_rule
from mixer_core.ranges import checked_ranges
from tests.seeds import case_seed
from train.core.session import RangeCheckError, checked_train_step, raise_range_errors


def gdn_inputs(seed, batch=1, length=3, heads=2, dim=4):
    rng = np.random.default_rng(case_seed(seed))
    k = rng.standard_normal((batch, length, heads, dim)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return dict(q=k.copy(), k=k, v=rng.standard_normal((batch, length, heads, dim)).astype(
        np.float32), g=-rng.uniform(0.01, 1, (batch, length, heads)).astype(np.float32),
        beta=rng.uniform(0, 1, (batch, length, heads)).astype(np.float32))


def spoiled(inputs, rng):
    """Each way out of range, at one random entry."""
    index = tuple(int(rng.integers(0, n)) for n in inputs["g"].shape)
    cases = []
    for name, value, message in [("g", 0.25, "g: expected log decay g <= 0"),
                                 ("g", np.nan, "g: expected log decay g <= 0"),
                                 ("beta", 1.5, "beta: expected beta in [0, 1]"),
                                 ("beta", -0.5, "beta: expected beta in [0, 1]")]:
        changed = {**inputs, name: inputs[name].copy()}
        changed[name][index] = value
        cases.append((changed, message))
    changed = {**inputs, "k": inputs["k"].copy()}
    changed["k"][index] *= 3.0
    cases.append((changed, "k: expected L2-normalised keys"))
    return cases


def test_concrete_gdn_arguments_out_of_range_raise_naming_the_argument():
    inputs = gdn_inputs(1300)
    rng = np.random.default_rng(case_seed(1301))
    for changed, message in spoiled(inputs, rng):
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            gated_delta_rule(**changed, implementation="reference")
    zero_keys = {**inputs, "k": np.zeros_like(inputs["k"]), "g": np.zeros_like(inputs["g"])}
    out, _ = gated_delta_rule(**zero_keys, implementation="reference")   # the edges are valid
    assert np.all(np.isfinite(out))


def test_checked_mode_catches_ranges_inside_jit():
    inputs = gdn_inputs(1302)
    rng = np.random.default_rng(case_seed(1303))

    def run(q, k, v, g, beta):
        return gated_delta_rule(q, k, v, g, beta, implementation="reference")[0]

    def checked(*args):
        with checked_ranges():
            return run(*args)

    checked_run = jax.jit(checkify.checkify(checked, errors=checkify.user_checks))
    names = ("q", "k", "v", "g", "beta")
    error, _ = checked_run(*(inputs[n] for n in names))
    assert error.get() is None
    for changed, message in spoiled(inputs, rng):
        jax.jit(run)(*(changed[n] for n in names))          # unchecked: no error, silently
        error, _ = checked_run(*(changed[n] for n in names))
        assert error.get() is not None and error.get().startswith(message), error.get()

    # FPA's beta > 0, likewise
    q = jnp.asarray(rng.standard_normal((1, 4, 2, 8)), jnp.float32)
    phi = jnp.asarray(rng.standard_normal((1, 4, 2)), jnp.float32)
    beta = jnp.asarray([0.5, -0.5], jnp.float32)
    with pytest.raises(ValueError, match="beta: expected every entry > 0"):
        fpa_attention(q, q, q, phi, phi, beta, implementation="reference")

    def attend(beta):
        with checked_ranges():
            return fpa_attention(q, q, q, phi, phi, beta, implementation="reference")

    error, _ = jax.jit(checkify.checkify(attend, errors=checkify.user_checks))(beta)
    assert error.get().startswith("beta: expected every entry > 0")


def test_trainer_checked_step_raises_range_check_error():
    inputs = gdn_inputs(1304)

    def train_step(state, batch):
        out, _ = gated_delta_rule(batch["q"], batch["k"], batch["v"], state["g"], batch["beta"],
                                  implementation="reference")
        return state, {"loss": jnp.sum(out)}

    step = raise_range_errors(jax.jit(checked_train_step(train_step)))
    batch = {n: inputs[n] for n in ("q", "k", "v", "beta")}
    step({"g": inputs["g"]}, batch)
    with pytest.raises(RangeCheckError, match="train.check_ranges: g: expected log decay"):
        step({"g": -inputs["g"]}, batch)


@pytest.mark.slow
def test_layers_keep_the_ranges_by_construction():
    """GatedDeltaNet and FPAAttention with random parameters blown up 30x (FPA's rho down to
    -60): in checked mode under jit, no range check fires and the outputs stay finite."""
    from fpa_jax import FPAAttention
    from gdn_jax import GatedDeltaNet

    rng = np.random.default_rng(case_seed(1305))
    x = jnp.asarray(rng.standard_normal((2, 11, 16)), jnp.float32)
    for layer in (GatedDeltaNet(num_heads=2, head_dim=4, implementation="reference"),
                  FPAAttention(num_heads=2, head_dim=8, implementation="reference")):
        # init compiled whole, the blow-up on the host (op by op, each small op of either
        # would compile on its own: about 140 compilations)
        params = jax.jit(layer.init)(jax.random.PRNGKey(case_seed(1306)), x)["params"]
        params = jax.tree.map(lambda p: jnp.asarray(30.0 * np.asarray(p) + np.asarray(
            rng.standard_normal(p.shape), p.dtype)), params)
        if "rho" in params:
            params = {**params, "rho": jnp.asarray([-60.0, 5.0], jnp.float32)}

        def apply(params):
            with checked_ranges():
                return layer.apply({"params": params}, x)

        error, out = jax.jit(checkify.checkify(apply, errors=checkify.user_checks))(params)
        assert error.get() is None, (type(layer).__name__, error.get())
        assert np.all(np.isfinite(out)), type(layer).__name__
