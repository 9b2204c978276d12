"""The public gated delta rule ops (gdn_jax/ops/api.py and the package's registries): the
implementation switch, the registry's default order and its fall-through to the next entry that
supports the inputs, keeps_chunk_states, the default initial state, packed documents in both
forms against separate runs, bfloat16 inputs, shard_map over heads, and bad inputs named in the
error. The chunked form and the oracle on their own: test_chunk.py, test_naive.py.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_jax
from gdn_jax.ops import gated_delta_rule, recurrent_gated_delta_rule
from gdn_jax.ops import api
from mixer_core.registry import Entry, Registry, UnsupportedImplementationError
from tests.gdn_jax.ops.delta_rule_cases import (ARGUMENT_NAMES, FAST_COMPILE, chunked,
                                                make_inputs, packed_segment_ids, recurrent,
                                                relative_error)


def test_single_token_and_default_state():
    """T = 1 (a one-token chunk); without an initial state the state starts from zeros."""
    q, k, v, g, beta, state = make_inputs(21, 2, 1, 2, 2, 8, 8)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def variants(q, k, v, g, beta, state):
        run = functools.partial(gated_delta_rule, q, k, v, g, beta, output_final_state=True,
                                chunk_size=16)
        return dict(default=run(), zeros=run(initial_state=jnp.zeros_like(state)),
                    oracle=recurrent_gated_delta_rule(q, k, v, g, beta, output_final_state=True),
                    no_state=gated_delta_rule(q, k, v, g, beta)[1])

    results = variants(q, k, v, g, beta, state)
    assert results["no_state"] is None
    for got, expected in zip(results["zeros"], results["default"]):
        np.testing.assert_array_equal(got, expected)
    for got, expected in zip(results["default"], results["oracle"]):
        assert relative_error(got, expected) < 2e-5


@pytest.mark.parametrize("implementation,expected_path",
                         [(None, "chunked"), ("xla", "chunked"), ("reference", "recurrent")])
def test_implementation_switch_selects_the_path(monkeypatch, implementation, expected_path):
    calls = []
    for path, name in (("chunked", "chunked_forward"), ("recurrent", "recurrent_forward")):
        original = getattr(api, name)
        monkeypatch.setattr(api, name, functools.partial(
            lambda path, original, *args, **kwargs: calls.append(path) or original(*args, **kwargs),
            path, original))
    inputs = make_inputs(22, 1, 5, 1, 1, 4, 4)
    jax.eval_shape(lambda *args: gated_delta_rule(*args, implementation=implementation),
                   *inputs[:5])
    assert calls == [expected_path]


def test_unknown_implementation_raises_naming_it():
    inputs = make_inputs(23, 1, 5, 1, 1, 4, 4)[:5]
    with pytest.raises(ValueError, match="^implementation: gated_delta_rule has no "
                                         "implementation 'triton'; expected None or one of"):
        gated_delta_rule(*inputs, implementation="triton")


def test_registry_default_order_and_cpu_default():
    from gdn_jax.ops import short_conv
    assert gdn_jax.REGISTRIES == {"gated_delta_rule": api.REGISTRY,
                                  "short_conv": short_conv.REGISTRY}
    assert api.REGISTRY.default_order == ("pallas", "xla")
    assert {"reference", "xla"} <= set(api.REGISTRY.names())
    assert api.REGISTRY.select(None, platform="cpu", compute_capability=None)[0] == "xla"


def test_default_falls_through_to_the_next_entry_that_supports_the_inputs(monkeypatch):
    """A fake "pallas" entry that takes only K = 8, in a copy of the registry."""
    _, xla = api.REGISTRY.select("xla")
    calls, seen_facts = [], []

    def fake_pallas(q, k, v, g, beta, **kwargs):
        calls.append(("pallas", sorted(kwargs)))
        return jnp.zeros(v.shape, jnp.float32), jnp.zeros(
            (v.shape[0], v.shape[2], q.shape[3], v.shape[3]), jnp.float32)

    def fake_supports(**facts):
        seen_facts.append(facts)
        return None if facts["head_dim"] == 8 else f"needs K = 8, got {facts['head_dim']}"

    def recording_xla(*arrays, **kwargs):
        calls.append(("xla", sorted(kwargs)))
        return xla(*arrays, **kwargs)

    twin = Registry("gated_delta_rule", default_order=api.REGISTRY.default_order, entries=(
        Entry("pallas", fake_pallas, fake_supports), Entry("xla", recording_xla)))
    monkeypatch.setattr(api, "REGISTRY", twin)
    config = ["chunk_size", "initial_state", "scale", "segment_ids"]

    inputs = make_inputs(24, 1, 5, 1, 2, 8, 4)
    out, state = jax.eval_shape(lambda *a: gated_delta_rule(*a[:5], initial_state=a[5],
                                                            output_final_state=True), *inputs)
    assert calls == [("pallas", config)] and out.shape == (1, 5, 2, 4) and state.shape == (1, 2, 8, 4)
    assert set(seen_facts[0]) == {"platform", "compute_capability", "dtype", "batch", "seq_len",
                                  "num_heads", "num_v_heads", "head_dim", "value_head_dim",
                                  "has_segment_ids", "has_initial_state", "chunk_size"}
    assert seen_facts[0]["has_initial_state"] and seen_facts[0]["num_v_heads"] == 2
    jax.eval_shape(lambda *a: gated_delta_rule(*a), *make_inputs(25, 1, 5, 1, 1, 4, 4)[:5])
    assert [name for name, _ in calls] == ["pallas", "xla"]
    with pytest.raises(UnsupportedImplementationError, match="cannot run 'pallas' here: needs K = 8, got 4"):
        gated_delta_rule(*make_inputs(26, 1, 5, 1, 1, 4, 4)[:5], implementation="pallas")


def test_keeps_chunk_states_asks_the_implementation_that_would_run(monkeypatch):
    """"xla" keeps its chunk-entering states; the default picks what `gated_delta_rule` would
    (here a stand-in "pallas" that takes every input), which answers for itself."""
    from mixer_kernels.mosaic_gpu.gated_delta import vjp
    facts = dict(dtype="bfloat16", head_dim=64, value_head_dim=64, chunk_size=64, seq_len=128)
    assert api.keeps_chunk_states("xla", **facts)
    portable = api.REGISTRY.select("xla")[1]
    twin = Registry("gated_delta_rule", default_order=api.REGISTRY.default_order, entries=(
        Entry("pallas", portable, lambda **_: None), Entry("xla", portable)))
    monkeypatch.setattr(api, "REGISTRY", twin)
    for residuals, keeps in (("inputs", False), ("internals", True)):
        monkeypatch.setattr(vjp, "RESIDUALS", residuals)
        assert api.keeps_chunk_states(None, **facts) is keeps
        assert api.keeps_chunk_states("xla", **facts)
    with pytest.raises(ValueError, match="no implementation 'fast'"):
        api.keeps_chunk_states("fast", **facts)


def test_packed_documents_match_separate_runs():
    """Each document of a packed row equals that document run alone from a fresh state."""
    batch, seq_len, heads, v_heads, key_dim, value_dim = 2, 70, 1, 2, 8, 4
    lengths = [[16, 1, 30, 23], [5, 60, 5]]
    # Row 1 reuses id 3 for its last document: a change of id, not its value, is a boundary.
    segment_ids = packed_segment_ids(lengths, [[0, 1, 2, 3], [3, 9, 3]])
    inputs = make_inputs(51, batch, seq_len, heads, v_heads, key_dim, value_dim)

    # The separate runs: one batch row per document, zero-padded to T (g = beta = k = v = 0
    # leaves a state unchanged), starting from the row's initial state for its first document.
    pieces, spans = [[] for _ in inputs], []
    host_inputs = [np.asarray(x) for x in inputs]
    for row, row_lengths in enumerate(lengths):
        begin = 0
        for index, length in enumerate(row_lengths):
            for piece, x in zip(pieces[:5], host_inputs[:5]):
                document = x[row, begin:begin + length]
                piece.append(np.pad(document, [(0, seq_len - length)] + [(0, 0)] * (x.ndim - 2)))
            start_state = host_inputs[5][row]
            pieces[5].append(start_state if index == 0 else np.zeros_like(start_state))
            spans.append((row, begin, length))
            begin += length
    separate_out, separate_final = recurrent(*[np.stack(piece) for piece in pieces])
    last_documents = np.cumsum([len(row_lengths) for row_lengths in lengths]) - 1

    results = dict(chunked=chunked(*inputs, segment_ids, chunk_size=16),
                   recurrent=recurrent(*inputs, segment_ids))
    for name, (out, final) in results.items():
        for document, (row, begin, length) in enumerate(spans):
            assert relative_error(out[row, begin:begin + length],
                                  separate_out[document, :length]) < 2e-5, (name, document)
        assert relative_error(final, separate_final[last_documents]) < 2e-5, name


def test_bfloat16_inputs_compute_in_float32():
    inputs = make_inputs(71, 1, 37, 2, 4, 8, 12, dtype=jnp.bfloat16)
    out, state = chunked(*inputs, chunk_size=16)
    assert out.dtype == jnp.bfloat16 and state.dtype == jnp.float32
    # Oracle in float32 on the same (bf16-rounded) values: only the output rounding differs.
    expected_out, expected_state = recurrent(*[x.astype(jnp.float32) for x in inputs])
    assert relative_error(out, expected_out) < 1e-2
    assert relative_error(state, expected_state) < 1e-4


@pytest.mark.parametrize("implementation", ["xla", "reference"])
def test_shard_map_over_heads_without_initial_state(implementation):
    """Heads split over a mesh of every CPU device: the zero initial state must vary over the
    mesh axis like the scan's output carry (it did not: a scan carry type error)."""
    devices = jax.device_count()
    q, k, v, g, beta, _ = make_inputs(95, 1, 21, devices, 2 * devices, 8, 4)
    mesh = jax.make_mesh((devices,), ("heads",), axis_types=(jax.sharding.AxisType.Auto,))
    by_head = jax.sharding.PartitionSpec(None, None, "heads")

    def attend(q, k, v, g, beta):
        return gated_delta_rule(q, k, v, g, beta, implementation=implementation,
                                chunk_size=8)[0]

    def out_and_grads(attend):
        def loss(*args):
            out = attend(*args)
            return jnp.sum(jnp.sin(out)), out
        grad = jax.grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)
        return jax.jit(grad, compiler_options=FAST_COMPILE)(q, k, v, g, beta)

    sharded = jax.shard_map(attend, mesh=mesh, in_specs=(by_head,) * 5, out_specs=by_head)
    grads, out = out_and_grads(sharded)
    expected_grads, expected_out = out_and_grads(attend)
    np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-6)
    for name, got, want in zip(ARGUMENT_NAMES, grads, expected_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=name)


def _bad_input_cases():
    q, k, v, g, beta, state = (np.zeros(s, np.float32) for s in
                               [(2, 5, 2, 4), (2, 5, 2, 4), (2, 5, 4, 3), (2, 5, 4), (2, 5, 4),
                                (2, 4, 4, 3)])
    good = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=state)
    cases = [
        (dict(q=q[0]), ValueError, "q: expected rank 4"),
        (dict(k=k[:, :, :1]), ValueError, "k: expected shape"),
        (dict(v=v[:1]), ValueError, "v: expected leading dims"),
        (dict(v=v[:, :4]), ValueError, "v: expected leading dims"),
        (dict(v=np.zeros((2, 5, 3, 3))), ValueError, "multiple of H = 2"),
        (dict(g=g[..., :2]), ValueError, "g: expected shape"),
        (dict(beta=beta[:, :, :, None]), ValueError, "beta: expected rank 3"),
        (dict(beta=beta[:, :4]), ValueError, "beta: expected shape"),
        (dict(initial_state=state[:, :, :3]), ValueError, "initial_state: expected shape"),
        (dict(initial_state=state[0]), ValueError, "initial_state: expected rank 4"),
        (dict(q=q.astype(np.int32)), TypeError, "q: expected a floating dtype"),
        (dict(beta=beta.astype(np.int8)), TypeError, "beta: expected a floating dtype"),
        (dict(g=[[0.0]]), TypeError, "g: expected an array"),
        (dict(segment_ids=np.zeros((2, 5), np.float32)), TypeError,
         "segment_ids: expected an integer"),
        (dict(segment_ids=np.zeros((2, 4), np.int32)), ValueError, "segment_ids: expected shape"),
        (dict(chunk_size=0), ValueError, "chunk_size: expected a positive int"),
        (dict(chunk_size=16.0), TypeError, "chunk_size: expected a positive int"),
        (dict(scale=-1.0), ValueError, "scale: expected a positive"),
        (dict(output_final_state="yes"), TypeError, "output_final_state: expected a bool"),
        (dict(q=q[:, :0], k=k[:, :0], v=v[:, :0], g=g[:, :0], beta=beta[:, :0]), ValueError,
         "at least one time step"),
    ]
    params = [pytest.param(change, error, message, id=message)
              for change, error, message in cases]
    return params, good


BAD_CASES, GOOD_ARGUMENTS = _bad_input_cases()


@pytest.mark.parametrize("change,error,message", BAD_CASES)
def test_bad_inputs_raise_clear_errors(change, error, message):
    arguments = {**GOOD_ARGUMENTS, **change}
    positional = [arguments.pop(name) for name in ARGUMENT_NAMES[:5]]
    for op in (gated_delta_rule, recurrent_gated_delta_rule):
        if op is recurrent_gated_delta_rule and "chunk_size" in arguments:
            continue
        with pytest.raises(error, match=re.escape(message)):
            op(*positional, **arguments)
