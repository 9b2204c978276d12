"""Dispatch of the attention ops through their registries (docs/api.md, "Dispatch").

Unknown names fail naming `implementation`; an explicit entry that cannot run says why; the
default walks the registry's order and falls through to the first entry that supports the
inputs. Calls that only need to reach an implementation are traced with jax.eval_shape.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fpa_jax
from fpa_jax.baselines import fox, softmax
from fpa_jax.baselines.softmax import cudnn_supports
from fpa_jax.dispatch import attention_facts
from fpa_jax.fpa import api
from fpa_jax.fpa.fields import document_starts
from mixer_core.registry import Entry, Registry, UnsupportedImplementationError
from tests.seeds import case_seed

BATCH, LENGTH, HEADS = 2, 5, 3


def _inputs(seed, dim=8, dtype=jnp.float32):
    """Every array any attention op takes, at [BATCH, LENGTH, HEADS, dim]."""
    rng = np.random.default_rng(case_seed(seed))
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
    q, k, v = (normal(BATCH, LENGTH, HEADS, dim) for _ in range(3))
    per_token = jnp.asarray(rng.standard_normal((3, BATCH, LENGTH, HEADS)), jnp.float32)
    return dict(q=q, k=k, v=v, log_forget=-jnp.abs(per_token[0]), phi=per_token[1],
                psi=per_token[2], beta=jnp.ones((HEADS,), jnp.float32),
                pair=jnp.asarray(rng.standard_normal((BATCH, LENGTH, LENGTH)), jnp.float32))


CALLS = {
    "fpa_attention": lambda a, **kw: fpa_jax.fpa_attention(
        a["q"], a["k"], a["v"], a["phi"], a["psi"], a["beta"], **kw),
    "fox_attention": lambda a, **kw: fpa_jax.fox_attention(
        a["q"], a["k"], a["v"], a["log_forget"], **kw),
    "softmax_attention": lambda a, **kw: fpa_jax.softmax_attention(a["q"], a["k"], a["v"], **kw),
    "selective_attention": lambda a, **kw: fpa_jax.selective_attention(
        a["q"], a["k"], a["v"], a["pair"], **kw),
    "dcp_attention": lambda a, **kw: fpa_jax.dcp_attention(a["q"], a["k"], a["v"], a["pair"], **kw),
    "dipsum_attention": lambda a, **kw: fpa_jax.dipsum_attention(
        a["q"], a["k"], a["v"], a["phi"], a["psi"], a["beta"], **kw),
}

DEFAULT_ORDERS = {
    "fpa_attention": ("pallas", "xla"),
    "fox_attention": ("pallas", "xla"),
    "softmax_attention": ("cudnn", "pallas", "xla"),
    "selective_attention": ("reference",),
    "dcp_attention": ("reference",),
    "dipsum_attention": ("reference",),
}


def test_one_registry_per_op_with_its_default_order():
    assert set(fpa_jax.REGISTRIES) == set(CALLS)
    for op_name, registry in fpa_jax.REGISTRIES.items():
        assert registry.op_name == op_name
        assert registry.default_order == DEFAULT_ORDERS[op_name]
        assert "reference" in registry.names()
        assert ("xla" in registry.names()) == ("xla" in DEFAULT_ORDERS[op_name])
    assert "cudnn" in fpa_jax.REGISTRIES["softmax_attention"].names()


@pytest.mark.parametrize("op_name", sorted(CALLS))
def test_unknown_name_raises_naming_implementation(op_name):
    with pytest.raises(ValueError, match=f"^implementation: {op_name} has no implementation "
                                         "'flash9'; expected None or one of"):
        CALLS[op_name](_inputs(1), implementation="flash9")


@pytest.mark.parametrize("op_name", sorted(CALLS))
def test_default_on_cpu_is_the_fast_xla_path_or_the_dense_reference(op_name):
    inputs = _inputs(2, dtype=jnp.bfloat16)  # bf16, dims cuDNN takes: only the platform rules it out
    facts = attention_facts(inputs["q"], inputs["v"], None, has_alibi=False, block_size=None,
                            query_level=False, content=True, tau=1.0)
    name, _ = fpa_jax.REGISTRIES[op_name].select(None, **facts)
    assert name == ("xla" if "xla" in DEFAULT_ORDERS[op_name] else "reference")
    out = jax.eval_shape(lambda a: CALLS[op_name](a), inputs)
    assert out.shape == inputs["v"].shape and out.dtype == jnp.bfloat16


def test_explicit_cudnn_on_cpu_says_why():
    inputs = _inputs(3, dtype=jnp.bfloat16)
    with pytest.raises(UnsupportedImplementationError,
                       match="^implementation: softmax_attention cannot run 'cudnn' here: "
                             "needs a GPU, got platform cpu"):
        CALLS["softmax_attention"](inputs, implementation="cudnn")


@pytest.mark.parametrize("change, reason", [
    (dict(), None),
    (dict(platform="cpu"), "needs a GPU, got platform cpu"),
    (dict(dtype=jnp.dtype(jnp.float32)), "needs bfloat16 or float16 inputs, got float32"),
    (dict(has_segment_ids=True), "does not take segment_ids"),
    (dict(has_alibi=True), "does not take ALiBi slopes"),
    (dict(value_head_dim=32), "needs equal q and v head dims, got 64 and 32"),
    (dict(head_dim=256, value_head_dim=256), "head dim <= 128 and a multiple of 8, got 256"),
    (dict(head_dim=60, value_head_dim=60), "head dim <= 128 and a multiple of 8, got 60"),
])
def test_cudnn_supports_states_each_condition(change, reason):
    facts = dict(platform="gpu", compute_capability="9.0", dtype=jnp.dtype(jnp.float16),
                 batch=1, seq_len=128, num_heads=4, head_dim=64, value_head_dim=64,
                 has_segment_ids=False, has_alibi=False, block_size=None)
    got = cudnn_supports(**{**facts, **change})
    assert got == reason if reason is None else reason in got


# Each op's entry signature (the keyword config its `fn` receives) and op-specific facts.
PLUGINS = {
    "fpa_attention": (api, dict(scale=8 ** -0.5, tau=1.0, query_level=False, content=True,
                                block_size=None), {"query_level", "content", "block_size", "tau"}),
    "fox_attention": (fox, dict(scale=8 ** -0.5, block_size=None), {"block_size"}),
    "softmax_attention": (softmax, dict(scale=8 ** -0.5, block_size=None),
                          {"has_alibi", "block_size"}),
}
COMMON_FACTS = {"platform", "compute_capability", "dtype", "batch", "seq_len", "num_heads",
                "head_dim", "value_head_dim", "has_segment_ids"}


@pytest.mark.parametrize("op_name", sorted(PLUGINS))
def test_default_falls_through_to_the_next_entry_that_supports_the_inputs(op_name, monkeypatch):
    """A fake "pallas" entry that takes only head_dim 8 in a copy of the op's registry."""
    module, config, op_facts = PLUGINS[op_name]
    _, xla = module.REGISTRY.select("xla")
    calls, seen_facts = [], []

    def fake_pallas(*arrays, **kwargs):
        calls.append(("pallas", kwargs))
        return jnp.zeros_like(arrays[2])

    def fake_supports(**facts):
        seen_facts.append(facts)
        return None if facts["head_dim"] == 8 else f"needs head_dim 8, got {facts['head_dim']}"

    def recording_xla(*arrays, **kwargs):
        calls.append(("xla", kwargs))
        return xla(*arrays, **kwargs)

    twin = Registry(op_name, default_order=module.REGISTRY.default_order, entries=(
        Entry("pallas", fake_pallas, fake_supports), Entry("xla", recording_xla)))
    monkeypatch.setattr(module, "REGISTRY", twin)

    jax.eval_shape(lambda a: CALLS[op_name](a), _inputs(4, dim=8))
    assert calls == [("pallas", config)]
    assert set(seen_facts[0]) == COMMON_FACTS | op_facts
    assert seen_facts[0]["head_dim"] == 8 and seen_facts[0]["platform"] == "cpu"
    jax.eval_shape(lambda a: CALLS[op_name](a), _inputs(5, dim=4))
    assert [name for name, _ in calls] == ["pallas", "xla"]  # "cudnn" is not in the copy
    with pytest.raises(UnsupportedImplementationError,
                       match="cannot run 'pallas' here: needs head_dim 8, got 4"):
        CALLS[op_name](_inputs(6, dim=4), implementation="pallas")


def test_document_starts_mark_every_document_start_including_t0():
    segment_ids = jnp.asarray([[4, 4, 7, 7, 7], [1, 2, 2, 3, 3]], jnp.int32)
    np.testing.assert_array_equal(document_starts(segment_ids),
                                  [[1, 0, 1, 0, 0], [1, 1, 0, 1, 0]])
    np.testing.assert_array_equal(document_starts(jnp.asarray([[3], [5]], jnp.int32)), [[1], [1]])
