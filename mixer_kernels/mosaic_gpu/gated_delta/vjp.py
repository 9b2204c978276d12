"""Chunked gated delta rule with the state recurrence in Pallas Mosaic GPU kernels.

Same math as `gdn_jax.ops.chunk` (chunk C = 64, WY form). The per-chunk preparation (A,
(I + A)^{-1}, W, U, Kw and the intra-chunk attention P) runs in the Pallas kernel
`wy_kernel.prepare` (its backward: the kernel again for the inverse, then the hand-written
`wy.prepare_backward` in XLA with that inverse given, or the one kernel
`wy_backward_kernel.backward`: switch `INTRA_BACKWARD`); XLA forms the per-token rows
(`wy.chunk_rows`); the outputs from the entering states,

    O_c = diag(e) Q_c S_c + (Q_c K_c^T ⊙ Gamma) (U_c - W_c S_c)

run in `output_kernels.forward` and their backward in `output_kernels.backward` (switch
`OUTPUTS`; XLA's products where a kernel's shared memory does not fit).

The sequential part, S_{c+1} = rho_c S_c + Kw_c^T (U_c - W_c S_c) with Kw_c = diag(Gamma_{C,:})
K_c and rho_c = e_C, runs in `state_kernels.forward_states`; its `jax.custom_vjp` backward runs
the reverse recurrence in `state_kernels.backward_states` and forms, batched over chunks, in
`state_gradient_kernel.state_gradients` (or XLA's products: switch `STATE_GRADIENTS`)

    dW_c = -dU_c S_c^T   dKw_c = (U_c - W_c S_c) lambda_{c+1}^T   drho_c = <S_c, lambda_{c+1}>

Where every reader of the entering states is a kernel (the default switches; K, V in
{64, 128}), the recurrence and the outputs are one `jax.custom_vjp`
(`recurrence_and_outputs`): the states leave the forward kernel in the operand dtype, and the
state-gradient kernel takes the outputs' dU, so dU and dW come out summed.

    q, k [B, T, H, K]   v [B, T, HV, V]   g, beta [B, T, HV]   S [B, HV, K, V] float32
    internals chunk-major: Kw, W [N, B, HV, C, K] (16-bit), U [N, B, HV, C, V] float32

Residuals (`RESIDUALS = "inputs"`, the default): only the inputs; the whole forward runs
again in the backward pass, behind an optimization barrier so that XLA cannot merge it with
the forward pass's identical kernel calls (which would keep their outputs alive after all).
With `RESIDUALS = "internals"`: the entering states [N, B, HV, K, V] (float32 as the "xla"
path saves, or 16-bit where only kernels read them: `kernels_take_all_states`), the inputs (q padded), W, Kw, P (16-bit), U (float32) and the decays e;
(I + A)^{-1} and the outputs (`chunk_outputs`) are recomputed in the backward pass.
Matrix operands of the kernels are 16-bit (bf16/f16: the dtype of q and k); float32 inputs run
only in interpret mode (tests), with float32 operands.
"""

import functools

import jax
import jax.numpy as jnp

from mixer_core.delta_rule_math import compute_dtype
from mixer_kernels.mosaic_gpu.gated_delta import (output_kernels, state_gradient_kernel,
                                                  state_kernels, wy, wy_backward_kernel,
                                                  wy_kernel)
from mixer_core.interpret import interpret_active
from mixer_core.padding import pad_time
from mixer_core.recompute import keeping_inputs_only
from mixer_kernels.mosaic_gpu.gated_delta.common import CHUNK, summed_over_group

# The backward of the WY preparation: "xla" runs the WY kernel again for T = (I + A)^{-1}, then
# `wy.prepare_backward`; "pallas" runs `wy_backward_kernel.backward` (T formed inside, one
# launch) where its shared memory fits (K = V = 128 and below at 16 bits), "xla" otherwise.
# Read when the backward is traced. On the H200 "pallas" takes the op's forward+backward from
# 4.50 to 3.44 ms at (4, 4096, 16, 128) and from 2.13 to 1.52 ms at (8, 2048, 12, 64), with the
# same bf16 accuracy (docs/benchmarks.md). The gdn_125m train step: 58 ms of device time per
# step with "xla" (a trace), 52 ms wall with "pallas" (two-window bench): not yet like for like.
# Read when the backward is traced (a compiled function keeps its choice).
INTRA_BACKWARD = "pallas"

# The operands of the op's XLA matrix products (the chunk outputs, their backward and the
# state gradients): "float32" casts the 16-bit W, P and q up and multiplies in float32 (TF32 on
# the GPU by XLA's default precision); "16-bit" rounds the float32 states, U - W S and the
# cotangents to the kernels' operand dtype and accumulates in float32, as the kernels do (and
# fla's output kernels). Read when the op is traced. On the H200 "16-bit" takes 5% off the op's
# device time and nothing measurable off the gdn_125m step, for a larger bf16 error
# (docs/benchmarks.md, "Two switches"), so float32 is the default.
XLA_OPERANDS = "float32"

# What the op keeps for its backward pass: "inputs" keeps only the op's inputs and runs the
# forward (the WY kernel, the forward state kernel, the outputs) again at the start of the
# backward pass, the trade fla makes; "internals" keeps the chunk-major W, Kw, P (16-bit), U and
# the entering states (float32), about 168 MiB per GDN layer at (8, 2048, 12 heads of 64). Read
# when the op is traced. On the H200 "inputs" takes the gdn_125m step's peak at 2048 x 8 from
# 13.11 to 10.80 GiB at the same 52.5 ms per step, and the op's forward+backward at
# (4, 4096, 16, 128) stays at 3.05 ms of device time (docs/benchmarks.md).
RESIDUALS = "inputs"

# The chunk outputs O_c and their backward: "pallas" runs `output_kernels.forward` and
# `.backward` (16-bit operands, float32 accumulation) where their shared memory fits (K, V in
# {64, 128} both; XLA's products otherwise); "xla" runs `chunk_outputs`, XLA products with
# operands by `XLA_OPERANDS`. Read when the op is traced.
OUTPUTS = "pallas"

# The per-chunk gradients of the state recurrence's inputs (dW, dKw, drho from dU, lambda and
# the entering states): "pallas" runs `state_gradient_kernel.state_gradients` (16-bit operands,
# float32 accumulation; the reverse recurrence then writes its lambdas in 16 bits) where its
# shared memory fits (K, V in {64, 128}); "xla" forms them in XLA products with operands by
# `XLA_OPERANDS`. Read when the backward is traced.
STATE_GRADIENTS = "pallas"


def _manual_axes(*arrays):
    """Mesh axes over which any of the arrays varies inside `shard_map` (empty outside)."""
    def varying(x):
        aval = jax.typeof(x)
        manual = getattr(aval, "manual_axis_type", None)       # jax 0.11; `vma` in others
        return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))
    return frozenset().union(*(varying(x) for x in arrays))


def _varying(arrays, axes):
    """Mark each array as varying over `axes` (a kernel's outputs know no `shard_map` axes)."""
    return tuple(x if not (missing := axes - _manual_axes(x))
                 else jax.lax.pcast(x, tuple(sorted(missing)), to="varying") for x in arrays)


def _folding_batch_axes(kernel, in_axes, out_axes):
    """`kernel` with a vmap rule that folds the mapped axis into each array's batch axis
    (`in_axes` / `out_axes`: where B sits), so a vmapped call is one launch of the kernel;
    inside `shard_map` its outputs vary over the manual axes its inputs vary over."""

    @jax.custom_batching.custom_vmap
    def call(*arrays):
        return kernel(*arrays)

    @call.def_vmap
    def _rule(axis_size, in_batched, *arrays):
        folded = []
        for x, batched, axis in zip(arrays, in_batched, in_axes):
            x = x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
            x = jnp.moveaxis(x, 0, axis)                      # [..., X, B, ...]
            folded.append(x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2:]))
        outs = []
        for y, axis in zip(call(*folded), out_axes):
            y = y.reshape(*y.shape[:axis], axis_size, -1, *y.shape[axis + 1:])
            outs.append(jnp.moveaxis(y, axis, 0))
        return tuple(outs), (True,) * len(outs)

    def run(*arrays):   # inside shard_map: outputs vary over the inputs' manual axes
        return _varying(call(*arrays), _manual_axes(*arrays))

    return run


@functools.cache
def _forward_states(tiling, states_16bit):
    """The forward state kernel for one tiling, batchable by vmap, behind one jax.jit, so the
    layers of a model share one traced program, lowered once per step."""
    return _folding_batch_axes(
        jax.jit(functools.partial(state_kernels.forward_states, tiling=tiling,
                                  states_16bit=states_16bit)),
        in_axes=(1, 1, 1, 0, 0), out_axes=(1, 0))


@functools.cache
def _backward_states(tiling, lambdas_16bit):
    """The backward state kernel, as `_forward_states`."""
    return _folding_batch_axes(
        jax.jit(functools.partial(state_kernels.backward_states, tiling=tiling,
                                  lambdas_16bit=lambdas_16bit)),
        in_axes=(1, 1, 1, 0, 0), out_axes=(1, 1, 0))


@functools.cache
def _state_gradient_kernel(with_outputs_du=False):
    """`state_gradient_kernel.state_gradients` behind one jax.jit, batchable by vmap (B is
    axis 1 of every array); with_outputs_du: it takes the outputs' dU and returns the total."""
    count = 1 if with_outputs_du else 0
    return _folding_batch_axes(jax.jit(state_gradient_kernel.state_gradients),
                               in_axes=(1,) * (5 + count), out_axes=(1,) * (3 + count))


def _xla_operands(op_dtype, dtype):
    """The operand dtype of the XLA matrix products (`XLA_OPERANDS`)."""
    if XLA_OPERANDS not in ("float32", "16-bit"):
        raise ValueError(f"XLA_OPERANDS: expected 'float32' or '16-bit', got {XLA_OPERANDS!r}")
    return jnp.dtype(op_dtype if XLA_OPERANDS == "16-bit" else dtype)


def _product(spec, a, b, operands):
    """einsum(spec, a, b) in float32 from operands rounded to `operands`; with 16-bit operands
    the backward multiplies the cotangent rounded to 16 bits too (`_product_16`)."""
    if jnp.dtype(operands).itemsize >= 4:
        return jnp.einsum(spec, a.astype(operands), b.astype(operands))
    return _product_16(spec, jnp.dtype(operands), a.dtype, b.dtype, a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _product_16(spec, operands, a_dtype, b_dtype, a, b):
    return _product_16_fwd(spec, operands, a_dtype, b_dtype, a, b)[0]


def _product_16_fwd(spec, operands, a_dtype, b_dtype, a, b):
    a, b = a.astype(operands), b.astype(operands)
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32), (a, b)


def _product_16_bwd(spec, operands, a_dtype, b_dtype, residuals, cotangent):
    """Matmul-like specs only: every index of an operand is in the other operand or the output.
    The cotangents leave in the inputs' dtypes (float32 ones are not rounded to 16 bits)."""
    a, b = residuals
    left, rest = spec.split(",")
    right, out = rest.split("->")
    cotangent = cotangent.astype(operands)
    d_a = jnp.einsum(f"{out},{right}->{left}", cotangent, b, preferred_element_type=jnp.float32)
    d_b = jnp.einsum(f"{left},{out}->{right}", a, cotangent, preferred_element_type=jnp.float32)
    return d_a.astype(a_dtype), d_b.astype(b_dtype)


_product_16.defvjp(_product_16_fwd, _product_16_bwd)


def kernels_take_all_states(key_dim, value_dim):
    """Whether every reader of the entering states is a kernel (the chunk outputs and their
    backward, the state gradients): then `recurrence_and_outputs` runs the recurrence and the
    outputs as one VJP."""
    return (OUTPUTS == "pallas" and STATE_GRADIENTS == "pallas"
            and output_kernels.fits(key_dim, value_dim, backward=False)
            and output_kernels.fits(key_dim, value_dim, backward=True)
            and state_gradient_kernel.fits(key_dim, value_dim))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def state_recurrence(kw, w, u, rho, s0, tiling):
    """(entering states [N, B, HV, K, V], final state [B, HV, K, V]), float32; see module
    docstring. Where only kernels read the states, `recurrence_and_outputs` runs instead."""
    return _forward_states(tiling, False)(kw, w, u, rho, s0)


def _state_recurrence_fwd(kw, w, u, rho, s0, tiling):
    states, final = _forward_states(tiling, False)(kw, w, u, rho, s0)
    return (states, final), (kw, w, u, rho, states)


def _state_recurrence_bwd(tiling, residuals, cotangents):
    kw, w, u, rho, states = residuals
    d_states, d_final = cotangents
    in_kernel = STATE_GRADIENTS == "pallas" and state_gradient_kernel.fits(*states.shape[-2:])
    lambdas, d_u, d_s0 = _backward_states(tiling, in_kernel)(kw, w, d_states, rho, d_final)
    if in_kernel:
        d_w, d_kw, rows = _state_gradient_kernel()(states.astype(w.dtype), lambdas, d_u, u, w)
        d_rho = jnp.moveaxis(rows[..., 0, :].sum(-1), 0, -1)                    # [B, HV, N]
    else:
        operands = _xla_operands(w.dtype, jnp.float32)
        d_w = -_product("nbhcv,nbhkv->nbhck", d_u, states, operands)
        new_values = u - _product("nbhck,nbhkv->nbhcv", w, states, operands)
        d_kw = _product("nbhcv,nbhkv->nbhck", new_values, lambdas, operands)
        d_rho = jnp.einsum("nbhkv,nbhkv->bhn", states, lambdas)
    d_rho = jnp.pad(d_rho, [(0, 0), (0, 0), (0, rho.shape[-1] - d_rho.shape[-1])])
    return d_kw.astype(kw.dtype), d_w.astype(w.dtype), d_u, d_rho, d_s0


state_recurrence.defvjp(_state_recurrence_fwd, _state_recurrence_bwd)


@functools.cache
def _wy_kernel(scale, with_inverse):
    """The WY preparation kernel behind one jax.jit, batchable by vmap (B is axis 0 of its
    inputs, 1 of outputs)."""
    return _folding_batch_axes(
        jax.jit(functools.partial(wy_kernel.prepare, scale=scale, with_inverse=with_inverse)),
        in_axes=(0, 0, 0, 0), out_axes=(1,) * (5 if with_inverse else 4))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def wy_preparation(q, k, v, rows, scale):
    """(W, U, Kw, P) chunk-major from the kernel (`wy_kernel.prepare`), then q itself: the
    callers read q through this output, so that the cotangent of q from its other readers (the
    chunk outputs) reaches this backward. Backward (no residuals beyond the inputs), by
    `INTRA_BACKWARD`: the kernel runs again for T = (I + A)^{-1}, then `wy.prepare_backward`
    with T given, or `wy_backward_kernel.backward` forms all; for group 1 that kernel adds the
    outputs' dq to its own in float32 before rounding, else XLA adds the two."""
    return _wy_preparation_fwd(q, k, v, rows, scale)[0]


def _wy_preparation_fwd(q, k, v, rows, scale):
    return (*_wy_kernel(scale, False)(q, k, v, rows), q), (q, k, v, rows)


@functools.cache
def _wy_backward_kernel(scale, with_dq_more):
    """`wy_backward_kernel.backward` behind one jax.jit, batchable by vmap (B is axis 0 of q,
    k, v, rows, dq_more and of the outputs, 1 of the cotangents)."""
    def run(q, k, v, rows, *cotangents):
        dq_more = cotangents[4] if with_dq_more else None
        return wy_backward_kernel.backward(q, k, v, rows, cotangents[:4], dq_more, scale=scale)

    in_axes = (0, 0, 0, 0, 1, 1, 1, 1) + ((0,) if with_dq_more else ())
    return _folding_batch_axes(jax.jit(run), in_axes=in_axes, out_axes=(0, 0, 0, 0))


def _wy_preparation_bwd(scale, residuals, cotangents):
    _, k, v, _ = residuals
    *cotangents, d_q_more = cotangents
    if INTRA_BACKWARD == "pallas" and wy_backward_kernel.fits(k.shape[-1], v.shape[-1]):
        if v.shape[2] == k.shape[2]:         # group 1: the kernel adds the outputs' dq
            return _wy_backward_kernel(scale, True)(*residuals, *cotangents, d_q_more)
        d_q, *rest = _wy_backward_kernel(scale, False)(*residuals, *cotangents)
    else:
        inverse = _wy_kernel(scale, True)(*residuals)[4]
        d_q, *rest = wy.prepare_backward(*residuals, inverse, cotangents, scale=scale)
    return (d_q + d_q_more, *rest)


wy_preparation.defvjp(_wy_preparation_fwd, _wy_preparation_bwd)


def operand_dtype(q, k):
    """The dtype of the kernels' matrix operands W and Kw (derived from q and k): bf16 or
    f16 as the inputs; float32 only for interpret mode. U and the state stay float32."""
    dtype = jnp.result_type(q.dtype, k.dtype)
    return dtype if dtype in (jnp.bfloat16, jnp.float16) else jnp.dtype(jnp.float32)


def chunked_forward_pallas(q, k, v, g, beta, *, scale, initial_state, segment_ids,
                           value_tile=None):
    """Gated delta rule with the kernels; inputs validated (see `gdn_jax.ops.api`).

    Returns (out [B, T, HV, V], final_state [B, HV, K, V]), both float32.
    """
    num_chunks = -(-q.shape[1] // CHUNK)
    dtype = jnp.dtype(compute_dtype(q, k, v, g, beta, initial_state))
    op_dtype = jnp.dtype(operand_dtype(q, k))
    if op_dtype == jnp.float32 and not interpret_active():
        raise ValueError(f"q, k: the pallas kernels need bf16 or fp16 (16-bit tensor-core "
                         f"operands), got {q.dtype}, {k.dtype}")
    if RESIDUALS not in ("internals", "inputs"):
        raise ValueError(f"RESIDUALS: expected 'internals' or 'inputs', got {RESIDUALS!r}")
    tiling = state_kernels.choose_tiling(num_chunks, CHUNK, q.shape[3], v.shape[3], op_dtype,
                                         value_tile=value_tile)
    body = functools.partial(_chunked_body, scale=float(scale), tiling=tiling, dtype=dtype,
                             op_dtype=op_dtype)
    if RESIDUALS == "inputs":
        body = keeping_inputs_only(body)
    return body(q, k, v, g, beta, initial_state, segment_ids)


def _chunked_body(q, k, v, g, beta, initial_state, segment_ids, *, scale, tiling, dtype,
                  op_dtype):
    """`chunked_forward_pallas` after its checks: (out [B, T, HV, V], final state)."""
    batch, seq_len, _, key_dim = q.shape
    num_v_heads, value_dim = v.shape[2], v.shape[3]
    num_chunks = -(-seq_len // CHUNK)
    padded = num_chunks * CHUNK
    q, k, v = (pad_time(x.astype(op_dtype), padded) for x in (q, k, v))
    rows, entering_decay = wy.chunk_rows(pad_time(g, padded), pad_time(beta, padded),
                                         segment_ids, num_chunks, CHUNK)    # e [N, B, HV, C]
    state_weights, base_values, weighted_keys, attention, q = wy_preparation(q, k, v, rows, scale)
    if initial_state is None:
        state = jnp.zeros((batch, num_v_heads, key_dim, value_dim), jnp.float32)
    else:
        state = initial_state.astype(jnp.float32)
    rho = jnp.moveaxis(entering_decay[..., -1], 0, -1)                        # [B, HV, N]
    rho = jnp.pad(rho, [(0, 0), (0, 0), (0, state_kernels.padded_chunks(num_chunks) - num_chunks)])
    recurrence_inputs = (weighted_keys, state_weights, base_values, rho, state)
    if OUTPUTS not in ("pallas", "xla"):
        raise ValueError(f"OUTPUTS: expected 'pallas' or 'xla', got {OUTPUTS!r}")
    if STATE_GRADIENTS not in ("pallas", "xla"):
        raise ValueError(f"STATE_GRADIENTS: expected 'pallas' or 'xla', got {STATE_GRADIENTS!r}")
    if kernels_take_all_states(key_dim, value_dim):
        inputs = recurrence_inputs + (q, attention, entering_decay)
        out, final_state = recurrence_and_outputs(*_varying(inputs, _manual_axes(*inputs)),
                                                  tiling, scale, dtype)
        return out[:, :seq_len], final_state.astype(dtype)
    states, final_state = state_recurrence(
        *_varying(recurrence_inputs, _manual_axes(*recurrence_inputs)), tiling)

    outputs = chunk_outputs
    if OUTPUTS == "pallas" and output_kernels.fits(key_dim, value_dim, backward=False):
        outputs = chunk_outputs_pallas
    out = outputs(q, states, state_weights, base_values, attention, entering_decay, scale,
                  dtype)
    return out[:, :seq_len], final_state.astype(dtype)


@functools.cache
def _output_kernels(scale, with_dw=True):
    """(forward, backward) chunk output kernels, each behind one jax.jit and batchable by
    vmap (B is axis 0 of q, dO, O and dq, axis 1 of the chunk-major arrays); with_dw: the
    backward returns dW."""
    forward = _folding_batch_axes(
        jax.jit(lambda *arrays: (output_kernels.forward(*arrays, scale=scale),)),
        in_axes=(0, 1, 1, 1, 1, 1), out_axes=(0,))
    backward = _folding_batch_axes(
        jax.jit(functools.partial(output_kernels.backward, scale=scale, with_dw=with_dw)),
        in_axes=(0, 1, 1, 1, 1, 1, 0), out_axes=(0,) + (1,) * (5 if with_dw else 4))
    return forward, backward


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def chunk_outputs_pallas(q, states, state_weights, base_values, attention, entering_decay,
                         scale, dtype):
    """`chunk_outputs` by `output_kernels.forward`; its backward by `output_kernels.backward`
    where that fits shared memory, else autodiff of `chunk_outputs`. Keeps its inputs (the
    float32 states, which the state recurrence keeps too) and rounds S to q's dtype."""
    return _chunk_outputs_pallas_fwd(q, states, state_weights, base_values, attention,
                                     entering_decay, scale, dtype)[0]


def _chunk_outputs_pallas_fwd(q, states, state_weights, base_values, attention, entering_decay,
                              scale, dtype):
    (out,) = _output_kernels(scale)[0](q, states.astype(q.dtype), state_weights, base_values,
                                       attention, entering_decay[..., None, :])
    residuals = (q, states, state_weights, base_values, attention, entering_decay)
    return out.astype(dtype), residuals


def _chunk_outputs_pallas_bwd(scale, dtype, residuals, d_out):
    q, states, state_weights, base_values, attention, entering_decay = residuals
    key_dim, value_dim = q.shape[3], states.shape[-1]
    if not output_kernels.fits(key_dim, value_dim, backward=True):
        _, pull = jax.vjp(lambda *xs: chunk_outputs(*xs, scale, dtype), *residuals)
        return pull(d_out)
    d_q, d_states, d_w, d_u, d_p, d_e = _output_kernels(scale)[1](
        q, states.astype(q.dtype), state_weights, base_values, attention,
        entering_decay[..., None, :], d_out.astype(q.dtype))
    d_q = summed_over_group(d_q, q)
    return d_q, d_states, d_w, d_u, d_p, d_e[..., 0, :]


chunk_outputs_pallas.defvjp(_chunk_outputs_pallas_fwd, _chunk_outputs_pallas_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10))
def recurrence_and_outputs(kw, w, u, rho, s0, q, attention, entering_decay, tiling, scale,
                           dtype):
    """(out [B, N C, HV, V] in `dtype`, final state [B, HV, K, V] float32): `state_recurrence`
    then `chunk_outputs_pallas` as one VJP, where only kernels read the entering states
    (`kernels_take_all_states`). The forward state kernel writes the states in the operand
    dtype, as every reader rounds them so (float32 in interpret mode with float32 operands);
    the backward hands the outputs' dU to the state-gradient kernel, which forms the total dU
    (in the operand dtype, as the WY backward reads it) and dW = -dU_total S^T (the outputs
    read U and W only through U - W S), so XLA sums neither."""
    return _recurrence_and_outputs_fwd(kw, w, u, rho, s0, q, attention, entering_decay,
                                       tiling, scale, dtype)[0]


def _recurrence_and_outputs_fwd(kw, w, u, rho, s0, q, attention, entering_decay, tiling, scale,
                                dtype):
    states, final = _forward_states(tiling, w.dtype != jnp.float32)(kw, w, u, rho, s0)
    (out,) = _output_kernels(scale, False)[0](q, states.astype(q.dtype), w, u, attention,
                                              entering_decay[..., None, :])
    residuals = (kw, w, u, rho, states, q, attention, entering_decay)
    return (out.astype(dtype), final), residuals


def _recurrence_and_outputs_bwd(tiling, scale, dtype, residuals, cotangents):
    kw, w, u, rho, states, q, attention, entering_decay = residuals
    d_out, d_final = cotangents
    d_q, d_states, d_u_out, d_p, d_e = _output_kernels(scale, False)[1](
        q, states.astype(q.dtype), w, u, attention, entering_decay[..., None, :],
        d_out.astype(q.dtype))
    lambdas, d_u_rec, d_s0 = _backward_states(tiling, True)(kw, w, d_states, rho, d_final)
    d_w, d_kw, rows, d_u = _state_gradient_kernel(True)(states.astype(w.dtype), lambdas,
                                                        d_u_rec, u, w, d_u_out)
    d_rho = jnp.moveaxis(rows[..., 0, :].sum(-1), 0, -1)                        # [B, HV, N]
    d_rho = jnp.pad(d_rho, [(0, 0), (0, 0), (0, rho.shape[-1] - d_rho.shape[-1])])
    d_q = summed_over_group(d_q, q)
    # d_u leaves in U's float32; the WY backward rounds it back, and XLA drops the pair
    return (d_kw.astype(kw.dtype), d_w.astype(w.dtype), d_u.astype(u.dtype), d_rho, d_s0,
            d_q, d_p, d_e[..., 0, :])


recurrence_and_outputs.defvjp(_recurrence_and_outputs_fwd, _recurrence_and_outputs_bwd)


@functools.partial(jax.checkpoint, static_argnums=(6, 7), prevent_cse=False)
def chunk_outputs(q, states, state_weights, base_values, attention, entering_decay, scale,
                  dtype):
    """O_c = scale diag(e) Q_c S_c + P_c (U_c - W_c S_c) in `dtype`, [B, N C, HV, V].

    q [B, N C, H, K] (16-bit); states [N, B, HV, K, V] float32; W [N, B, HV, C, K], P [N, B,
    HV, C, C] (16-bit); U [N, B, HV, C, V] float32; e [N, B, HV, C]. Recomputed in the backward
    pass (jax.checkpoint): it keeps its inputs, not the float32 copies of the 16-bit operands
    and the products (U - W S, Q S) that the einsums' backward would otherwise save (a GDN
    layer's autodiff residuals at (8, 2048, 12 heads of 64): 693 -> 429 MiB).
    """
    batch, padded, num_heads, key_dim = q.shape
    num_chunks, _, num_v_heads, _, value_dim = states.shape
    group = num_v_heads // num_heads
    operands = _xla_operands(q.dtype, dtype)
    new_values = base_values - _product("nbhck,nbhkv->nbhcv", state_weights, states, operands)
    queries = q.reshape(batch, num_chunks, CHUNK, num_heads, key_dim)
    from_states = _product("bnchk,nbhgkv->nbhgcv", queries, states.reshape(
        num_chunks, batch, num_heads, group, key_dim, value_dim), operands)
    out = (scale * entering_decay[..., None] * from_states.reshape(new_values.shape)
           + _product("nbhij,nbhjv->nbhiv", attention, new_values, operands))
    return out.transpose(1, 0, 3, 2, 4).reshape(batch, padded, num_v_heads, value_dim)
