"""Context parallelism in the trainer (mesh.context, mixer_core/shard.py ring_or_shard).

The 8-device check runs in one subprocess (XLA_FLAGS must be set before JAX starts): a hybrid
GDN + FPA model ("GAA": FPA with query levels, its first layer without bias) and a FoX model,
float32, on data 1 x fsdp 2 x tensor 1 x context 4
(8 tokens per device) against the same config on one device (no context axis, no split at all:
its program compiles faster than a 2-device one, and the split model must give the same
function):
  * the train step's loss and its gradients, and the loss after one SGD update, agree to
    float32 reordering;
  * packed documents: row 0 has a document starting exactly at device 1's first token, row 1
    boundaries inside devices 1 and 3, row 2 a random cut, row 3 one document;
  * the program really takes the context-parallel path: the traced loss has a `ppermute`, a
    shard_map whose body sees T / 4 = 8 tokens, and per-token activations constrained along
    "context" (the equality alone would also hold if everything were gathered);
  * attention.block_size (set in the FoX case) reaches the ring forms;
  * softmax attention with ALiBi through the FoX ring (the path of the softmax layer and of
    FPA's no-bias layers) equals the dense op, values and gradients.
The config checks run in process; the 8-device checks in one subprocess (tests/devices.py).
"""

import textwrap
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.devices import run_on_cpu_devices
from tests.seeds import case_seed
from train.core.config import ConfigError
from train.core.memory import activation_bytes_per_token, estimate_train_memory
from train.core.presets import load_config
from train.core.sharding import check_rows_per_process, make_mesh
from train.core.validation import validate_for_devices

SCRIPT = textwrap.dedent("""
    import json, re, sys
    import jax, numpy as np
    from train.core.presets import load_config
    from train.core.session import build_session, to_global
    from train.core.sharding import make_mesh, mesh_context
    from train.core.step import masked_mean, token_losses

    assert jax.device_count() == 8
    seed = int(sys.argv[1])
    LR = 0.5   # one SGD step

    def config(kind, pattern, context, extra=()):
        return load_config(None, [
            "model.d_model=32", f"model.pattern={pattern}", f"model.num_layers={len(pattern)}",
            f"attention.kind={kind}", "attention.num_heads=2", "attention.head_dim=8",
            "gdn.num_heads=2", "gdn.head_dim=8", "data.seq_len=32", "data.batch_size=4",
            "mesh.fsdp=2", f"mesh.context={context}", f"train.seed={seed % 1000}", *extra])

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 257, (4, 33), dtype=np.int32)
    segments = np.ones((4, 33), np.int32)
    segments[0, 8:] = 2                                  # at device 1's first input token
    segments[1, 8 + rng.integers(1, 8):] = 2             # inside device 1
    segments[1, 24 + rng.integers(1, 8):] = 3            # inside device 3
    segments[2, rng.integers(1, 32):] = 2
    batch = {"tokens": tokens, "segment_ids": segments}

    def run(config, mesh, initial=None):
        # (grads, [loss, loss after the SGD step], the loss's jaxpr text, the params on the
        # host): from `initial` (host params) if given, else from the session's own init
        session = build_session(config, 257, mesh)
        model, shardings = session.model, session.state_shardings["params"]

        def loss(params, batch):   # the train step's loss (train/core/step.py)
            terms = token_losses(model, params, batch)
            return masked_mean(terms["losses"] + terms["aux"], terms["mask"])

        with mesh_context(session.mesh):
            if initial is None:
                initial = jax.device_get(session.init_state()["params"])
            params = jax.device_put(initial, shardings)
            global_batch = to_global(session, batch)
            # the loss's own trace shows the path the model takes (no second trace of the step)
            traced = jax.jit(jax.value_and_grad(loss), in_shardings=(
                shardings, {name: session.batch_sharding for name in batch})).trace(
                params, global_batch)
            text = str(traced.jaxpr)
            value_and_grad = traced.lower().compile()
            first, grads = value_and_grad(params, global_batch)
            grads = jax.device_get(grads)
            # the update on the host (op by op on the devices, each leaf's shape compiles twice)
            stepped = jax.device_put(jax.tree.map(lambda p, g: p - LR * g, initial, grads),
                                     shardings)
            second, _ = value_and_grad(stepped, global_batch)
        return grads, [float(first), float(second)], text, initial

    out = {}
    # GDN (state passing), then FPA with query levels: a bias-free layer (the softmax ring) and
    # a biased one
    variant = ["attention.query_level=true", "attention.no_bias_layers=[1]"]
    for name, kind, pattern, extra in [("fpa_gdn", "fpa", "GAA", variant),
                                       ("fox", "fox", "A", ("attention.block_size=8",))]:
        want_grads, want_losses, _, initial = run(config(kind, pattern, 1, extra),
                                                  make_mesh((1, 1, 1), jax.devices()[:1]))
        # the same parameters, placed on the context mesh (one init program, not two: the
        # host init is the same for every mesh, tests/train/core/test_sharding.py)
        grads, losses, text, _ = run(config(kind, pattern, 4, extra), make_mesh((1, 2, 1, 4)),
                                     initial)
        errors = jax.tree.map(
            lambda a, b: float(np.max(np.abs(a - b)) / (1e-12 + np.max(np.abs(b)))),
            grads, want_grads)
        out[name] = {
            "losses": losses, "want_losses": want_losses,
            "grad_errors": {jax.tree_util.keystr(path): e for path, e in
                            jax.tree_util.tree_leaves_with_path(errors)},
            "smallest_grad": min(float(np.max(np.abs(g))) for g in jax.tree.leaves(want_grads)),
            "ppermute": text.count("ppermute"),
            "local_q": bool(re.search(r"f32\\[2,8,2,8\\]", text)),   # [B/2, T/4, H, D]
            "time_constraint": bool(re.search(r"sharding_constraint\\[[^]]*'context'", text)),
        }

    # softmax attention through the FoX ring (ALiBi: log_forget = -slope), no_bias FPA layers
    # and the softmax layer take this path: values and gradients against the dense op
    import jax.numpy as jnp
    from fpa_jax import alibi_slopes, softmax_attention
    from fpa_jax import context_shard
    B, T, H, D = 2, 32, 2, 8
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32) for _ in range(3))
    ids = jnp.asarray(segments[:2, :T])
    weights = jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32)

    def attention_loss(split, q, k, v):
        kwargs = dict(scale=0.3, segment_ids=ids, alibi_slopes=alibi_slopes(H))
        out = (context_shard.softmax_attention(q, k, v, **kwargs) if split else
               softmax_attention(q, k, v, implementation="reference", **kwargs))
        return jnp.sum(weights * out), out

    grads = lambda split: jax.jit(jax.grad(lambda *a: attention_loss(split, *a),
                                           argnums=(0, 1, 2), has_aux=True))(q, k, v)
    want = grads(False)
    with mesh_context(make_mesh((1, 2, 1, 4))):
        got = grads(True)
    out["softmax_alibi_errors"] = [
        float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
        for a, b in zip(jax.device_get(jax.tree.leaves(got)),
                        jax.device_get(jax.tree.leaves(want)))]
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_context_parallel_training_equals_the_mesh_without_context():
    # at the session's CPU optimisation level 0 (the rings at XLA's default level:
    # tests/fpa_jax/test_context_parallel.py)
    result = run_on_cpu_devices(SCRIPT, str(case_seed(1201)))
    assert set(result) == {"fpa_gdn", "fox", "softmax_alibi_errors"}
    errors = result.pop("softmax_alibi_errors")
    assert len(errors) == 4 and max(errors) < 1e-5, errors   # grads of q, k, v and the output
    for name, case in result.items():
        assert case["want_losses"][0] != case["want_losses"][1], name   # the update moved it
        np.testing.assert_allclose(case["losses"], case["want_losses"], rtol=2e-6, err_msg=name)
        assert case["smallest_grad"] > 0, name
        assert len(case["grad_errors"]) > 10, name
        for leaf, error in case["grad_errors"].items():
            assert error < 1e-4, (name, leaf, error)   # relative to the leaf's largest entry
        assert case["ppermute"] > 0 and case["local_q"] and case["time_constraint"], name
    assert any("mixer']['delta_proj" in leaf for leaf in result["fpa_gdn"]["grad_errors"])
    assert any("mixer']['A_log" in leaf for leaf in result["fpa_gdn"]["grad_errors"])


BASE = ["model.pattern=GA", "data.seq_len=32", "mesh.context=4"]


@pytest.mark.parametrize("overrides, message", [
    (["data.seq_len=30"], r"data.seq_len=30 must be divisible by mesh.context=4"),
    (["attention.kind=selective", "attention.position=nope"], r"mesh.context=4 supports attention.kind"),
    (["attention.kind=dcp"], r"mesh.context=4 supports attention.kind"),
    (["attention.dip_sum=true"], r"attention.dip_sum"),
    (["attention.implementation=xla"], r"attention.implementation='xla' must be unset"),
    (["mesh.context=0"], r"mesh.context must be >= 1"),
])
def test_impossible_context_configs_are_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, BASE + overrides)


def test_context_configs_that_work():
    # GDN only: any attention kind is fine; softmax (RoPE, ALiBi) goes through the FoX ring
    load_config(None, BASE + ["model.pattern=G", "attention.kind=selective",
                              "attention.position=nope"])
    for position in ("rope", "alibi"):
        load_config(None, BASE + ["attention.kind=softmax", f"attention.position={position}"])


def test_mesh_sizes_with_a_context_axis():
    config = load_config(None, BASE + ["mesh.fsdp=2"])
    assert validate_for_devices(config, 8) == (1, 2, 1, 4)
    assert validate_for_devices(config, 16) == (2, 2, 1, 4)
    assert validate_for_devices(load_config(None, BASE[:2]), 8) == (8, 1, 1)   # context 1
    with pytest.raises(ConfigError, match="mesh.context"):
        validate_for_devices(config, 4)
    with pytest.raises(ValueError, match="sizes"):
        make_mesh((1, 1), None)


def test_memory_estimate_counts_the_key_blocks_the_ring_keeps():
    # 3 layers, 2 of them attention (H Dh = 2 x 8): each keeps k and v of the other 3 devices
    config = load_config(None, BASE + ["model.num_layers=3", "model.pattern=GAA",
                                       "attention.num_heads=2", "attention.head_dim=8"])
    ring = 2 * (4 - 1) * 2 * 8 * 4                     # (k, v) x 3 blocks x H Dh x float32
    plain = activation_bytes_per_token(config, 257)
    assert activation_bytes_per_token(config, 257, 4) == plain + 2 * ring
    # model.remat: only the widest block is live; small GDN heads make it an attention block
    remat = load_config(None, BASE + ["model.num_layers=3", "model.pattern=GAA",
                                      "attention.num_heads=2", "attention.head_dim=8",
                                      "gdn.num_heads=1", "gdn.head_dim=4", "model.remat=true"])
    assert activation_bytes_per_token(remat, 257, 4) == \
        activation_bytes_per_token(remat, 257) + ring
    state = {"params": {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32)}, "opt_state": {}}
    estimate = estimate_train_memory(config, state, 257, (1, 1, 1, 4))
    assert estimate.activation_bytes_per_token == plain + 2 * ring
    for bad in [(1, 1), (1, 1, 1, 4, 1), (1, 0, 1)]:
        with pytest.raises(ValueError, match="mesh_shape"):
            estimate_train_memory(config, state, 257, bad)


def test_a_context_axis_spanning_processes_is_refused():
    # each process feeds its own rows: the devices of one batch shard must share a process
    def mesh(shape, names, processes):
        devices = np.empty(int(np.prod(shape)), object)
        devices[:] = [SimpleNamespace(process_index=p) for p in processes]
        return SimpleNamespace(devices=devices.reshape(shape), axis_names=names)

    names = ("data", "fsdp", "tensor", "context")
    check_rows_per_process(mesh((2, 1, 1, 4), names, [0] * 4 + [1] * 4))   # context inside
    check_rows_per_process(mesh((1, 2, 2, 2), names, [0] * 4 + [1] * 4))   # fsdp across
    with pytest.raises(ValueError, match=r"batch shard 0 .* processes \[0, 1\]"):
        check_rows_per_process(mesh((1, 1, 1, 8), names, [0] * 4 + [1] * 4))
    with pytest.raises(ValueError, match="processes"):             # tensor across, context 1
        check_rows_per_process(mesh((2, 2), ("data", "tensor"), [0, 1, 0, 1]))
    check_rows_per_process(make_mesh((1, 1, 1), jax.devices()[:1]))   # one process
