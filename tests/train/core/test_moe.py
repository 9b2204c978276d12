"""Mixture-of-experts FFN (train/core/moe.py): against a dense loop over experts, the load-balancing
term, the tiny hybrid MoE preset training, and experts sharded over the data axis (8 CPU devices
in a subprocess: the XLA flag must be set before JAX starts)."""

import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.devices import run_on_cpu_devices
from tests.seeds import case_seed
from train.core.moe import (AUX_COLLECTION, MoEFeedForward, apply_with_auxiliary_loss,
                            expert_capacity, moe_dense_reference, route)
from train.core.presets import load_config

FAST_COMPILE = {"xla_backend_optimization_level": 0}


def capacity_keep_loop(experts, num_experts, capacity):
    """Independent oracle of the drop rule: first choices in token order, then second ..."""
    counts = np.zeros(num_experts, int)
    keep = np.zeros(experts.shape, bool)
    for choice in range(experts.shape[1]):
        for token in range(experts.shape[0]):
            if counts[experts[token, choice]] < capacity:
                keep[token, choice] = True
                counts[experts[token, choice]] += 1
    return keep


@pytest.mark.parametrize("capacity_factor", [0.0, 0.6])
def test_matches_dense_loop_over_experts_values_and_gradients(capacity_factor):
    """Dropless (grouped matmuls) and capacity (buffers, some assignments dropped) outputs and
    gradients w.r.t. every weight and the input equal a loop that runs every expert on every
    token and combines with the routing weights."""
    batch, length, width, num_experts, top_k, hidden = 2, 7, 8, 5, 2, 6
    seed = case_seed(int(capacity_factor * 10))
    rng = np.random.default_rng(seed)   # NumPy: jax.random would compile per shape
    x = jnp.asarray(rng.standard_normal((batch, length, width), np.float32))
    layer = MoEFeedForward(num_experts, top_k, hidden, capacity_factor=capacity_factor,
                           init_std=0.5)
    # init compiled whole (op by op, each of its small ops would compile on its own)
    params = nn.meta.unbox(jax.jit(layer.init)(jax.random.PRNGKey(seed), x)["params"])

    keep = None
    if capacity_factor:
        _, experts, _ = route(x.reshape(-1, width) @ params["router"], top_k)
        capacity = expert_capacity(batch * length, num_experts, top_k, capacity_factor)
        keep = capacity_keep_loop(np.asarray(experts), num_experts, capacity)
        assert 0 < (~keep).sum() < keep.size   # some assignments dropped, not all

    # a fixed random cotangent: a loss linear in the output adds no rounding of its own (sin(3 out)
    # turned the outputs' last-bit differences into 1e-5 relative gradient differences)
    cotangent = jnp.asarray(rng.standard_normal(x.shape, np.float32))

    def loss(forward):
        def value(params, x):
            out = forward(params, x)
            return jnp.sum(out * cotangent), out
        return jax.jit(jax.grad(value, argnums=(0, 1), has_aux=True),
                       compiler_options=FAST_COMPILE)(params, x)

    (grads, dx), out = loss(
        lambda p, x: layer.apply({"params": p}, x, mutable=[AUX_COLLECTION])[0])
    (want_grads, want_dx), want = loss(
        lambda p, x: moe_dense_reference(p, x, top_k=top_k, keep=keep))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    for name, got, expected in [("x", dx, want_dx)] + [
            (name, grads[name], want_grads[name]) for name in ("router", "gate", "up", "down")]:
        # float32 sums in another order: absolute error relative to the gradient's size
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max(),
                                   err_msg=name)


def test_load_balancing_term_is_one_under_uniform_routing_and_has_a_router_gradient():
    num_experts, top_k, coef = 4, 2, 0.03
    x = jnp.asarray(np.random.default_rng(case_seed(3)).standard_normal((2, 6, 8), np.float32))
    layer = MoEFeedForward(num_experts, top_k, 6, aux_loss_coef=coef)
    params = nn.meta.unbox(jax.jit(layer.init)(jax.random.PRNGKey(0), x)["params"])

    @jax.jit
    def aux(params):
        _, state = layer.apply({"params": params}, x, mutable=[AUX_COLLECTION])
        return state[AUX_COLLECTION]["load_balancing"][0]

    uniform = aux({**params, "router": jnp.zeros_like(params["router"])})
    assert uniform.shape == (2, 6)
    np.testing.assert_allclose(uniform, coef, rtol=1e-6)   # E * sum_e f_e / E = 1
    # mean_n a_n = E sum_e f_e P_e with f from the hard top-k choice
    _, experts, probs = route(x.reshape(-1, 8) @ params["router"], top_k)
    fractions = np.bincount(np.asarray(experts).ravel(), minlength=num_experts) / experts.size
    want = coef * num_experts * np.sum(fractions * np.asarray(probs).mean(0))
    np.testing.assert_allclose(aux(params).mean(), want, rtol=1e-5)
    router_grad = jax.grad(lambda p: aux(p).mean())(params)["router"]
    assert float(jnp.abs(router_grad).max()) > 0


@pytest.mark.slow
def test_tiny_hybrid_moe_preset_trains_three_steps():
    """The tiny preset (GDN + attention, MoE in every layer; cut to one layer of each here)
    through the trainer's session: three steps on one batch lower the loss; the layers sow one
    load-balancing term each."""
    from train.core.session import build_session, to_global
    from train.core.sharding import make_mesh, mesh_context

    config = load_config("hybrid_moe_tiny", ["model.num_layers=2", "model.pattern=GA",
                                             "data.seq_len=16", "data.batch_size=2",
                                             "optim.warmup_steps=0"])
    assert config.model.moe_experts == 4 and config.layer_sections() == ("gdn", "attention")
    session = build_session(config, 257, make_mesh((1, 1, 1), jax.devices()[:1]))
    rng = np.random.default_rng(case_seed(4))
    batch = {"tokens": rng.integers(0, 257, (2, 17), dtype=np.int32),
             "segment_ids": np.ones((2, 17), np.int32)}
    losses = []
    with mesh_context(session.mesh):
        state = session.init_state()
        for _ in range(3):
            state, metrics = session.train_step(state, to_global(session, batch))
            losses.append(float(metrics["loss"]))
        logits, aux = jax.jit(apply_with_auxiliary_loss, static_argnums=0)(
            session.model, state["params"], jnp.asarray(batch["tokens"][:, :16]),
            jnp.asarray(batch["segment_ids"][:, :16]))
    assert np.all(np.isfinite(losses)) and losses[2] < losses[0], losses
    assert logits.shape[:2] == aux.shape == (2, 16)
    # two MoE layers, each term coef * a_n with a_n near 1 for a young router
    assert 0.5 * 2 * 0.01 < float(aux.mean()) < 2 * 2 * 0.01


EXPERT_SHARDING_SCRIPT = textwrap.dedent("""
    import json
    import jax, numpy as np
    from train.core.presets import load_config
    from train.core.session import build_session, to_global
    from train.core.sharding import make_mesh, mesh_context

    config = load_config("hybrid_moe_tiny", [
        "model.pattern=A", "model.num_layers=2", "model.d_model=32", "model.moe_expert_dim=16",
        "model.moe_capacity_factor=1.5", "attention.num_heads=2", "attention.head_dim=16",
        "data.seq_len=16", "data.batch_size=4", "optim.warmup_steps=0"])
    rng = np.random.default_rng(SEED)
    batch = {"tokens": rng.integers(0, 257, (4, 17), dtype=np.int32),
             "segment_ids": np.ones((4, 17), np.int32)}
    out = {}
    initial = None
    for name, sizes, devices in [("single", (1, 1, 1), jax.devices()[:1]),
                                 ("sharded", (4, 1, 2), jax.devices())]:
        session = build_session(config, 257, make_mesh(sizes, devices))
        with mesh_context(session.mesh):
            if initial is None:
                initial = jax.device_get(session.init_state())
            state = jax.device_put(initial, session.state_shardings)
            losses = []
            for _ in range(2):
                state, metrics = session.train_step(state, to_global(session, batch))
                losses.append(float(metrics["loss"]))
        out[name] = losses
        out[name + "_gate_spec"] = str(state["params"]["layers_0"]["moe"]["gate"].sharding.spec)
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_experts_sharded_over_the_data_axis_train_like_one_device():
    """Capacity mode on data 4 x tensor 2: expert weights [E, D, F] are split over `data`
    (expert parallel) and `tensor`, and two steps give the one-device losses."""
    result = run_on_cpu_devices(EXPERT_SHARDING_SCRIPT.replace("SEED", str(case_seed(5))))
    assert result["sharded_gate_spec"] == str(jax.sharding.PartitionSpec("data", "fsdp", "tensor"))
    assert np.all(np.isfinite(result["single"]))
    np.testing.assert_allclose(result["sharded"], result["single"], rtol=0, atol=1e-5)
