"""Value-range checks (mixer_core/ranges.py): a concrete argument out of range raises ValueError
"<name>: expected <expectation>, got <worst>" at once; a traced one is checked only in checked
mode (`checked_ranges`, read while tracing), as a checkify check, and trusted otherwise."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from mixer_core.ranges import check_range, checked_ranges, ranges_checked
from tests.seeds import case_seed


def nonpositive(x, xp):
    return x <= 0


def largest(x, xp):
    return xp.max(x)


def check_g(g):
    check_range("g", g, nonpositive, "g <= 0 everywhere", largest)


def test_concrete_values_in_range_pass_and_out_of_range_raise_naming_the_worst():
    rng = np.random.default_rng(case_seed(5400))
    g = -rng.uniform(0.0, 3.0, (2, 7, 3)).astype(np.float32)
    g[1, 2, 0] = 0.0                                         # the edge is in range
    for value in (g, jnp.asarray(g), g.astype(np.float64), -1.0, 0.0):
        assert check_g(value) is None
    for index in (tuple(int(rng.integers(0, n)) for n in g.shape), (0, 0, 0), (1, 6, 2)):
        bad = g.copy()
        bad[index] = 0.625
        bad[(1 - index[0],) + index[1:]] = 0.125            # the worst of several is named
        for value in (bad, jnp.asarray(bad)):
            with pytest.raises(ValueError, match=r"^g: expected g <= 0 everywhere, got 0\.625$"):
                check_g(value)
    with pytest.raises(ValueError, match=r"^g: expected g <= 0 everywhere, got 1000\.0$"):
        check_g(1000.0)                                     # a Python scalar
    nan = g.copy()
    nan[0, 3, 1] = np.nan                                   # nan is out of every range
    with pytest.raises(ValueError, match=r"^g: expected g <= 0 everywhere, got nan$"):
        check_g(nan)


def test_empty_arrays_are_in_range():
    """No entries, nothing to check: neither `valid` nor `worst` (whose max of nothing would
    fail) is asked."""
    def all_at_most_zero(x, xp):                # a reduction, as a norm check might be
        return xp.max(x) <= 0

    for shape in ((0,), (2, 0, 3)):
        for value in (np.zeros(shape, np.float32), jnp.zeros(shape, jnp.bfloat16)):
            check_range("g", value, all_at_most_zero, "g <= 0", largest)


def test_half_precision_is_compared_in_float32():
    seen = []

    def valid(x, xp):
        seen.append((xp, x.dtype))
        return xp.linalg.norm(x, axis=-1) <= 1

    def worst(x, xp):
        return xp.max(xp.linalg.norm(x, axis=-1))

    for dtype in (jnp.bfloat16, jnp.float16):
        keys = jnp.asarray([[0.5, 0.5], [0.0, 1.0]], dtype)
        check_range("k", keys, valid, "unit keys", worst)
        with pytest.raises(ValueError, match=r"^k: expected unit keys, got 5\.0$"):
            check_range("k", jnp.asarray([[3.0, 4.0], [0.0, 1.0]], dtype), valid, "unit keys",
                        worst)      # the worst norm, not the largest entry
    assert seen and all(xp is np and dtype == np.float32 for xp, dtype in seen)
    seen.clear()
    check_range("k", np.asarray([[1.0, 0.0]]), valid, "unit keys", worst)
    assert seen == [(np, np.float64)]                        # wider dtypes are kept


def test_traced_values_are_trusted_outside_checked_mode():
    assert not ranges_checked()

    @jax.jit
    def f(g):
        check_g(g)
        return g * 2

    np.testing.assert_array_equal(f(jnp.asarray([1.0, -1.0])), [2.0, -2.0])   # no error
    # and under grad and vmap
    assert float(jax.grad(lambda g: (check_g(g), g ** 2)[1])(3.0)) == 6.0
    jax.vmap(check_g)(jnp.ones((3, 2)))


def run_checked(values, check=check_g):
    def f(g):
        with checked_ranges():
            check(g)
        return g + 1

    error, out = jax.jit(checkify.checkify(f, errors=checkify.user_checks))(values)
    return error.get(), out


def test_checked_mode_turns_the_check_into_a_checkify_check():
    rng = np.random.default_rng(case_seed(5401))
    g = -rng.uniform(0.0, 3.0, (4, 5)).astype(np.float32)
    message, out = run_checked(g)
    assert message is None
    np.testing.assert_allclose(out, g + 1)
    bad = g.copy()
    bad[tuple(int(rng.integers(0, n)) for n in g.shape)] = 2.5
    message, _ = run_checked(bad)
    assert message is not None and re.match(r"g: expected g <= 0 everywhere, got 2\.5\b",
                                            message), message
    bad[0, 0] = np.nan
    message, _ = run_checked(bad)
    assert message is not None and message.startswith("g: expected g <= 0 everywhere"), message
    # the concrete path is unchanged in checked mode: a ValueError at once
    with checked_ranges(), pytest.raises(ValueError, match="^g: expected"):
        check_g(np.asarray([0.5]))


def test_checked_mode_is_read_while_tracing_and_restored_after():
    """Entered around the tracing (not inside the function) it counts as well; leaving it, by an
    exception included, restores the mode before; checked_ranges(False) turns it off within."""
    def f(g):
        check_g(g)
        return g

    with checked_ranges():
        assert ranges_checked()
        error, _ = jax.jit(checkify.checkify(f, errors=checkify.user_checks))(jnp.asarray([1.0]))
        with checked_ranges(False):
            assert not ranges_checked()
            error_off, _ = jax.jit(checkify.checkify(f, errors=checkify.user_checks))(
                jnp.asarray([1.0]))
        assert ranges_checked()
    assert not ranges_checked()
    assert error.get() is not None and error.get().startswith("g: expected g <= 0")
    assert error_off.get() is None
    with pytest.raises(RuntimeError), checked_ranges():
        raise RuntimeError
    assert not ranges_checked()
