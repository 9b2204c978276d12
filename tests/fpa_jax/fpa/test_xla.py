"""FPA op: the blocked XLA path and its custom VJP against the dense oracle."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.seeds import run_seed
from fpa_jax import fields, fpa_attention, fpa_bias

SEED = run_seed()  # fresh every session; TEST_SEED reproduces it


_fields = jax.jit(fields)   # one program (op by op, each small op would compile on its own)


def make_inputs(seed, batch=2, length=37, heads=3, dim=8, step=1.0, tilt=0.0):
    """Drawn with NumPy, so only the fields compile (jax.random: a program per shape)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape, np.float32)
    q, k, v = (jnp.asarray(normal(batch, length, heads, dim)) for _ in range(3))
    delta = jnp.asarray(step * normal(batch, length, heads) + np.float32(tilt))
    phi, psi = _fields(delta, jnp.asarray(normal(*delta.shape)), jnp.asarray(normal(*delta.shape)))
    beta = jnp.asarray(np.logaddexp(np.float32(0), normal(heads)))   # softplus
    return q, k, v, phi, psi, beta


def loss_fn(implementation, **kw):
    """Weighted sum of the output (fixed, non-uniform weights)."""
    def loss(*args):
        out = fpa_attention(*args, implementation=implementation, **kw)
        out = out.astype(jnp.promote_types(out.dtype, jnp.float32))
        weights = jnp.cos(jnp.arange(out.size, dtype=out.dtype)).reshape(out.shape)
        return (out * weights).sum()
    return loss


def assert_close(got, want, rtol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), f"{what}: non-finite values (seed {SEED})"
    scale = max(np.abs(want).max(), 0.1)
    err = np.abs(got - want).max() / scale
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol} (seed {SEED})"


def value_and_grads(implementation, args, **kw):
    """Output and the gradient of every input, in one compiled program."""
    def run(*args):
        out = fpa_attention(*args, implementation=implementation, **kw)
        return out, jax.grad(loss_fn(implementation, **kw), argnums=range(6))(*args)
    return jax.jit(run)(*args)


def check_against_reference(args, rtol=2e-5, segment_ids=None, **kw):
    """Output and gradients of "xla" against "reference"; returns the "xla" ones."""
    ref_kw = {k: v for k, v in kw.items() if k != "block_size"}
    want, grads_want = value_and_grads("reference", args, segment_ids=segment_ids, **ref_kw)
    got, grads_got = value_and_grads("xla", args, segment_ids=segment_ids, **kw)
    assert got.dtype == args[0].dtype and got.shape == args[2].shape
    assert_close(got, want, rtol, "output")
    for name, g, w in zip(("q", "k", "v", "phi", "psi", "beta"), grads_got, grads_want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert_close(g, w, rtol, f"d{name}")
    return got, grads_got


@pytest.mark.parametrize("length,block,query_level,content", [
    (1, 8, False, True), (37, 8, True, True), (64, 16, False, False), (200, 32, False, True)])
def test_xla_matches_reference(length, block, query_level, content):
    args = make_inputs(SEED + length, length=length)
    check_against_reference(args, block_size=block, query_level=query_level, content=content)


def test_long_sequence_many_blocks():
    args = make_inputs(SEED + 1, batch=1, length=400, heads=1, dim=16)
    # dbeta sums 400 x 400 pairs in another order than the dense reference: up to about 7e-5
    # over fresh seeds in float32
    check_against_reference(args, rtol=1.5e-4, block_size=16)


@pytest.mark.parametrize("tilt", [5.0, -5.0])
def test_walk_drifting_by_1000(tilt):
    args = make_inputs(SEED + 2, batch=1, length=200, heads=2, step=3.0, tilt=tilt * 1.2)
    assert abs(float(args[3][0, -1, 0] - args[3][0, 0, 0])) > 900
    check_against_reference(args, rtol=2e-4, block_size=16)


def test_ties_in_field_and_level():
    # the shape and block of test_xla_matches_reference's T = 200 case: its compiled programs
    q, k, v, phi, psi, beta = make_inputs(SEED + 3, length=200)
    args = (q, k, v, jnp.round(phi), jnp.round(psi), beta)
    check_against_reference(args, block_size=32)


@pytest.mark.slow
def test_segments_match_reference_and_isolate_documents():
    args = make_inputs(SEED + 4, batch=2, length=150)
    segment_ids = jnp.array([[0] * 40 + [1] * 61 + [2] * 49, [7] * 9 + [8] * 141])
    check_against_reference(args, block_size=16, segment_ids=segment_ids)
    out = jax.jit(lambda *a: fpa_attention(*a, segment_ids=segment_ids, block_size=16))(*args)
    alone = jax.jit(functools.partial(fpa_attention, block_size=16))(
        *(a[:1, 40:101] if a.ndim > 1 else a for a in args))
    assert_close(out[:1, 40:101], alone, 1e-5, "second document alone")


def test_bf16_inputs_use_float32_statistics():
    q, k, v, phi, psi, beta = make_inputs(SEED + 5, length=150)
    low = tuple(x.astype(jnp.bfloat16) for x in (q, k, v))
    out = jax.jit(functools.partial(fpa_attention, block_size=32))(*low, phi, psi, beta)
    assert out.dtype == jnp.bfloat16
    want = jax.jit(functools.partial(fpa_attention, implementation="reference"))(
        *(x.astype(jnp.float32) for x in low), phi, psi, beta)
    assert_close(out, want, 2e-2, "bf16 output vs float32 reference")
    check_against_reference((*low, phi, psi, beta), rtol=3e-2, block_size=32)


def test_fox_special_case_equals_fox_formula():
    rng = np.random.default_rng(SEED + 6)
    batch, length, heads, dim = 2, 90, 3, 8
    log_forget = jnp.asarray(-np.logaddexp(np.float32(0), -2 - rng.standard_normal(
        (batch, length, heads), np.float32)))   # log sigmoid
    zeros = jnp.zeros_like(log_forget)
    phi, psi = fields(log_forget, zeros, zeros)
    bias = fpa_bias(phi, psi, jnp.ones(heads))
    cumulative = jnp.moveaxis(jnp.cumsum(log_forget, axis=1), 1, 2)  # [B, H, T]
    fox = cumulative[..., :, None] - cumulative[..., None, :]
    causal = jnp.tril(jnp.ones((length, length), bool))
    np.testing.assert_array_equal(np.asarray(jnp.where(causal, bias, 0.0)),
                                  np.asarray(jnp.where(causal, fox, 0.0)))
    q, k, v = (jnp.asarray(rng.standard_normal((batch, length, heads, dim), np.float32))
               for _ in range(3))

    @jax.jit
    def fox_attention(q, k, v, fox):
        logits = (jnp.einsum("bthd,bshd->bhts", q, k) * dim**-0.5
                  + jnp.where(causal, fox, -jnp.inf))
        return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits, -1), v)

    want = fox_attention(q, k, v, fox)
    got = jax.jit(functools.partial(fpa_attention, block_size=16))(q, k, v, phi, psi,
                                                                    jnp.ones(heads))
    assert_close(got, want, 1e-5, "FPA with FoX settings vs FoX")


def test_small_tau_gradient_matches_finite_differences_of_hard_forward():
    """As tau -> 0 the soft minimum's gradient is the hard minimum's (away from ties)."""
    with jax.enable_x64(True):
        q, k, v, phi, psi, beta = (jnp.asarray(x, jnp.float64) for x in make_inputs(SEED + 7, batch=1, length=40, heads=2))
        # Field values at least 0.05 apart (>> tau): no near-tie can split the soft minimum.
        order = np.random.default_rng(SEED + 7).permuted(
            np.broadcast_to(np.arange(40.0)[None, :, None], phi.shape), axis=1)
        phi = jnp.asarray(0.05 * order - 1.0)
        loss = jax.jit(lambda phi, psi: loss_fn("xla", tau=1e-4, block_size=8)(
            q, k, v, phi, psi, beta))
        grad_phi, grad_psi = jax.jit(jax.grad(loss, argnums=(0, 1)))(phi, psi)
        rng = np.random.default_rng(SEED)
        for _ in range(3):
            d_phi = jnp.asarray(rng.normal(size=phi.shape))
            d_psi = jnp.asarray(rng.normal(size=psi.shape))
            eps = 1e-6
            numeric = (loss(phi + eps * d_phi, psi + eps * d_psi)
                       - loss(phi - eps * d_phi, psi - eps * d_psi)) / (2 * eps)
            analytic = (grad_phi * d_phi).sum() + (grad_psi * d_psi).sum()
            np.testing.assert_allclose(float(analytic), float(numeric), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_tau_changes_only_the_gradient():
    args = make_inputs(SEED + 8, length=50)
    out_1, grads_1 = value_and_grads("xla", args, tau=1.0, block_size=16)
    out_2, grads_2 = check_against_reference(args, tau=0.3, block_size=16)
    np.testing.assert_array_equal(np.asarray(out_1), np.asarray(out_2))
    assert not np.allclose(np.asarray(grads_1[3]), np.asarray(grads_2[3]))   # d phi


@pytest.mark.slow
def test_jit_and_vmap():
    args = make_inputs(SEED + 9, length=33)
    eager = fpa_attention(*args, block_size=8)
    jitted = jax.jit(lambda *a: fpa_attention(*a, block_size=8))(*args)
    assert_close(jitted, eager, 1e-6, "jit")
    stacked = tuple(jnp.stack([a, a * 0.5]) for a in args)
    mapped = jax.vmap(lambda *a: fpa_attention(*a, block_size=8))(*stacked)
    assert_close(mapped[0], eager, 1e-6, "vmap[0]")
    half = fpa_attention(*(a * 0.5 for a in args), block_size=8)
    assert_close(mapped[1], half, 1e-6, "vmap[1]")


@pytest.mark.slow
def test_memory_is_linear_in_length():
    """The compiled forward+backward holds no T x T buffer: temporaries grow ~linearly."""
    def temp_bytes(length):
        args = make_inputs(0, batch=1, length=length, heads=1, dim=16)
        grad = jax.jit(jax.grad(loss_fn("xla", block_size=64), argnums=range(6)))
        return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes
    small, large = temp_bytes(2048), temp_bytes(8192)
    assert large < 6 * small, (small, large)  # quadratic would be 16x
    assert large < 8192 * 8192 * 4 / 4  # far below one dense float32 T x T matrix


def test_fields_restart_at_document_boundaries():
    delta = jnp.arange(1.0, 7.0).reshape(1, 6, 1)
    zero = jnp.zeros_like(delta)
    phi, psi = fields(delta, zero + 0.5, zero - 1.0, segment_ids=jnp.array([[0, 0, 0, 1, 1, 2]]))
    np.testing.assert_allclose(np.asarray(phi[0, :, 0]), [1.5, 3.5, 6.5, 4.5, 9.5, 6.5])
    np.testing.assert_allclose(np.asarray(psi[0, :, 0]), [0, 2, 5, 3, 8, 5])
    assert phi.dtype == jnp.float32


@pytest.mark.parametrize("change,match", [
    (lambda a: (a[0][..., :4], *a[1:]), "k: expected shape"),
    (lambda a: (a[0][0], *a[1:]), "q: expected rank 4"),
    (lambda a: (a[0].astype(jnp.int32), *a[1:]), "q: expected a floating dtype"),
    (lambda a: (*a[:3], a[3][:, :5], *a[4:]), "phi: expected shape"),
    (lambda a: (*a[:5], -a[5]), "beta: expected every entry > 0"),
    (lambda a: (*a[:5], a[5][:2]), "beta: expected shape"),
])
def test_bad_inputs_raise_clear_errors(change, match):
    args = make_inputs(0, length=10)
    with pytest.raises((ValueError, TypeError), match=match):
        fpa_attention(*change(args))


def test_bad_options_raise_clear_errors():
    args = make_inputs(0, length=10)
    with pytest.raises(ValueError, match="^implementation: fpa_attention has no implementation 'cuda'"):
        fpa_attention(*args, implementation="cuda")
    with pytest.raises(ValueError, match="tau"):
        fpa_attention(*args, tau=0.0)
    with pytest.raises(ValueError, match="segment_ids"):
        fpa_attention(*args, segment_ids=jnp.zeros((2, 9), jnp.int32))
    with pytest.raises(TypeError, match="segment_ids"):
        fpa_attention(*args, segment_ids=jnp.zeros((2, 10)))
    with pytest.raises(ValueError, match="block_size"):
        fpa_attention(*args, block_size=12)
