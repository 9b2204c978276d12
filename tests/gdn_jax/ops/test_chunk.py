"""The chunked (WY) form of the gated delta rule (gdn_jax/ops/chunk.py) against the
token-by-token oracle: outputs and final states in the gate regimes that stress it (strong
decay, a gate near one, nearly parallel keys), the gradients of every input (with packed
documents), 4096 steps with a gate near one, K = V = 256 and vmap; its block forward
substitution against a float64 inverse; and autodiff that stores one state per chunk, not per
token.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax.ops import gated_delta_rule, recurrent_gated_delta_rule
from gdn_jax.ops.chunk import unit_lower_inverse
from tests.gdn_jax.ops.delta_rule_cases import (ARGUMENT_NAMES, FAST_COMPILE, chunked,
                                                l2_normalise, make_inputs, packed_segment_ids,
                                                recurrent, relative_error)
from tests.seeds import case_seed


FORWARD_CASES = [
    # T not a multiple of the chunk, grouped value heads HV = 2H, V != K.
    dict(seq_len=37, chunk_size=16, heads=2, v_heads=4, key_dim=8, value_dim=12, seed=12),
    # T not a multiple of the chunk, HV = 4H, batch 2.
    dict(seq_len=100, chunk_size=32, heads=1, v_heads=4, key_dim=16, value_dim=8, seed=13,
         batch=2),
]


@pytest.mark.parametrize("case", FORWARD_CASES, ids=lambda c: f"T{c['seq_len']}C{c['chunk_size']}")
def test_chunked_forward_matches_recurrent(case):
    case = dict(case)
    chunk_size, seed, batch = case.pop("chunk_size"), case.pop("seed"), case.pop("batch", 1)
    for offset, (regime, aligned_keys) in enumerate(
            [("normal", False), ("strong", False), ("near_one", False), ("near_one", True)]):
        inputs = make_inputs(seed + 100 * offset, batch, regime=regime, aligned_keys=aligned_keys,
                             **case)
        out, state = chunked(*inputs, chunk_size=chunk_size)
        expected_out, expected_state = recurrent(*inputs)
        assert out.shape == expected_out.shape == inputs[2].shape
        assert relative_error(out, expected_out) < 2e-5, (regime, aligned_keys)
        assert relative_error(state, expected_state) < 2e-5, (regime, aligned_keys)


@pytest.mark.parametrize("size", [1, 5, 16, 37, 64])
def test_unit_lower_inverse_matches_float64(size):
    """Block forward substitution vs a float64 inverse, with coupling as strong as it gets."""
    rng = np.random.default_rng(case_seed(size))
    keys = l2_normalise(rng.standard_normal((1, 1, 16)) + 0.05 * rng.standard_normal((8, size, 16)))
    beta = rng.uniform(0.9, 1.0, (8, size, 1))
    coupling = np.tril(beta * keys @ keys.transpose(0, 2, 1), -1)
    expected = np.linalg.inv(np.eye(size) + coupling)
    got = jax.jit(unit_lower_inverse, compiler_options=FAST_COMPILE)(
        jnp.asarray(coupling, jnp.float32))
    # float32 rounding grows with the size and the coupling: up to about 1e-6 at 64 over
    # fresh seeds (a wrong substitution is off by O(1))
    assert relative_error(got, expected) < 4e-6
    assert relative_error(got @ (np.eye(size) + coupling), np.eye(size)) < 4e-6


GRADIENT_CASES = [
    dict(seq_len=37, chunk_size=16, heads=2, v_heads=4, key_dim=8, value_dim=8, seed=31,
         packed=False, regimes=("normal", "near_one")),
    dict(seq_len=64, chunk_size=16, heads=1, v_heads=2, key_dim=8, value_dim=8, seed=32,
         packed=True, regimes=("normal", "strong")),
]


@pytest.mark.parametrize("case", GRADIENT_CASES,
                         ids=lambda c: f"T{c['seq_len']}packed{c['packed']}")
def test_chunked_gradients_match_recurrent(case):
    seq_len, seed = case["seq_len"], case["seed"]
    segment_ids = None
    if case["packed"]:
        # documents of 10, 6 (starts and ends inside chunk 0), 16 (starts at chunk 1's first
        # token), 1 (a one-token document), and 31
        segment_ids = packed_segment_ids([[10, 6, 16, 1, 31]], [[0, 1, 2, 3, 4]])
    shapes = dict(seq_len=seq_len, heads=case["heads"], v_heads=case["v_heads"],
                  key_dim=case["key_dim"], value_dim=case["value_dim"])
    rng = np.random.default_rng(seed + 7)
    out_weights = jnp.asarray(rng.standard_normal(
        (1, seq_len, shapes["v_heads"], shapes["value_dim"])), jnp.float32)
    state_weights = jnp.asarray(rng.standard_normal(
        (1, shapes["v_heads"], shapes["key_dim"], shapes["value_dim"])), jnp.float32)

    def loss(op, **fixed):
        def value(q, k, v, g, beta, state):
            out, final = op(q, k, v, g, beta, initial_state=state, output_final_state=True,
                            segment_ids=segment_ids, **fixed)
            return jnp.sum(out * out_weights) + jnp.sum(final * state_weights)
        return jax.jit(jax.grad(value, argnums=tuple(range(6))), compiler_options=FAST_COMPILE)

    chunked_grad = loss(gated_delta_rule, chunk_size=case["chunk_size"])
    recurrent_grad = loss(recurrent_gated_delta_rule)
    for offset, regime in enumerate(case["regimes"]):
        inputs = make_inputs(seed + 100 * offset, 1, regime=regime, **shapes)
        for name, got, expected in zip(ARGUMENT_NAMES, chunked_grad(*inputs),
                                       recurrent_grad(*inputs)):
            assert np.all(np.isfinite(got)), (regime, name)
            assert relative_error(got, expected) < 1e-4, (regime, name)


def test_gate_near_one_over_4096_steps():
    inputs = make_inputs(41, 1, 4096, 1, 2, 16, 16, regime="near_one")
    out, state = chunked(*inputs, chunk_size=64)
    expected_out, expected_state = recurrent(*inputs)
    assert relative_error(out, expected_out) < 1e-4
    assert relative_error(state, expected_state) < 1e-4


def test_key_and_value_dim_256():
    inputs = make_inputs(61, 1, 20, 1, 1, 256, 256)
    out, state = chunked(*inputs, chunk_size=64)   # T < chunk_size: one chunk of 20 tokens
    expected_out, expected_state = recurrent(*inputs)
    assert relative_error(out, expected_out) < 5e-5
    assert relative_error(state, expected_state) < 5e-5


def test_vmap_over_an_extra_axis_matches_per_slice_calls():
    slices = [make_inputs(81 + i, 1, 37, 2, 4, 8, 12) for i in range(3)]
    stacked = [jnp.stack(parts) for parts in zip(*slices)]
    out, state = jax.vmap(functools.partial(chunked, chunk_size=16))(*stacked)
    for i, inputs in enumerate(slices):
        expected_out, expected_state = chunked(*inputs, chunk_size=16)
        np.testing.assert_allclose(out[i], expected_out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state[i], expected_state, rtol=1e-5, atol=1e-6)


def test_residuals_are_per_chunk_not_per_token():
    """Autodiff through the chunked form stores the inputs and one state per chunk only."""
    batch, seq_len, v_heads, key_dim, value_dim, chunk = 1, 256, 2, 8, 8, 32
    inputs = make_inputs(101, batch, seq_len, 1, v_heads, key_dim, value_dim)

    def residual_elements(op, **fixed):
        def run(*args):
            return op(*args[:5], initial_state=args[5], output_final_state=True, **fixed)
        leaves = jax.eval_shape(
            lambda *args: jax.tree_util.tree_leaves(jax.vjp(run, *args)[1]), *inputs)
        return sum(int(np.prod(leaf.shape)) for leaf in leaves)

    input_elements = sum(int(np.prod(x.shape)) for x in inputs)
    chunk_states = (seq_len // chunk) * batch * v_heads * key_dim * value_dim
    per_token_states = seq_len * batch * v_heads * key_dim * value_dim
    assert residual_elements(gated_delta_rule, chunk_size=chunk) <= input_elements + chunk_states
    # The oracle does store per-token states: the bound above is not trivially met.
    assert residual_elements(recurrent_gated_delta_rule) > per_token_states
