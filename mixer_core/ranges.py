"""Value-range checks shared by the op packages (FPA's beta > 0; the gated delta rule's g <= 0,
0 <= beta <= 1, |k_t| <= 1).

A concrete array (an eager call) is checked at once and a violation raises ValueError naming
the argument; a traced array (inside jit, grad, vmap) cannot be read, so it is checked only in
checked mode, `with checked_ranges():` while the function is traced, where each check becomes a
`jax.experimental.checkify.check` (run the function under `checkify.checkify` to read the
error). Outside checked mode traced values are trusted: the layers keep them in range by
construction (docs/fpa.md, docs/gdn.md).
"""

import contextlib
import contextvars

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

_CHECKED_RANGES = contextvars.ContextVar("checked_ranges", default=False)


@contextlib.contextmanager
def checked_ranges(enabled: bool = True):
    """Range checks of traced arguments become checkify checks while this is active (read
    when a function is traced: enter it inside the traced function, or trace afresh)."""
    token = _CHECKED_RANGES.set(enabled)
    try:
        yield
    finally:
        _CHECKED_RANGES.reset(token)


def ranges_checked() -> bool:
    return _CHECKED_RANGES.get()


def check_range(name, x, valid, expectation, worst):
    """valid(x, xp) -> bool array (True where in range); worst(x, xp) -> the scalar to report
    (xp: numpy for a concrete x, jax.numpy for a traced one). Concrete x: ValueError
    "<name>: expected <expectation>, got <worst>" on any violation; traced x: a checkify
    check in checked mode, else nothing (see the module doc)."""
    if isinstance(x, jax.core.Tracer):
        if ranges_checked():
            checkify.check(jnp.all(valid(x, jnp)), f"{name}: expected {expectation}, got {{}}",
                           worst(x, jnp))
        return
    values = np.asarray(x)
    if values.dtype.itemsize < 4:   # bf16 / f16: compare in float32
        values = values.astype(np.float32)
    if values.size and not np.all(valid(values, np)):
        raise ValueError(f"{name}: expected {expectation}, got {float(worst(values, np))}")
