"""The input check every sequence mixer layer runs first (mixer_core/inputs.py): x [batch,
length, model_dim] floating point, segment_ids and positions None or [batch, length] integer;
each mistake raises its own message naming the layer and the argument."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mixer_core.inputs import check_mixer_inputs


@pytest.mark.parametrize("shape", [(2, 5, 8), (1, 1, 3), (3, 0, 4)])
def test_valid_inputs_pass(shape):
    batch_length = shape[:2]
    for x_dtype in (jnp.float32, jnp.bfloat16, jnp.float16, np.float64):
        x = np.zeros(shape, x_dtype)
        for ids_dtype in (np.int32, np.int16, np.uint8, jnp.int8):
            ids = np.zeros(batch_length, ids_dtype)
            assert check_mixer_inputs("FPAAttention", x, ids, ids + 1) is None
            assert check_mixer_inputs("FPAAttention", jnp.asarray(x), jnp.asarray(ids),
                                      None) is None
        assert check_mixer_inputs("FPAAttention", x, None, None) is None


@pytest.mark.parametrize("shape", [(5, 8), (2, 5, 8, 1), (8,), ()])
def test_x_of_another_rank_is_refused(shape):
    message = (r"^GatedDeltaNet: x must have shape \[batch, length, model_dim\], got shape "
               + re.escape(str(shape)) + "$")
    with pytest.raises(ValueError, match=message):
        check_mixer_inputs("GatedDeltaNet", jnp.zeros(shape), None, None)
    with pytest.raises(ValueError, match=message):       # before its dtype is looked at
        check_mixer_inputs("GatedDeltaNet", jnp.zeros(shape, jnp.int32), None, None)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.bool_, jnp.complex64])
def test_x_not_floating_point_is_refused(dtype):
    with pytest.raises(TypeError, match=rf"^FoX: x must be floating point, got dtype "
                                        rf"{jnp.dtype(dtype).name}$"):
        check_mixer_inputs("FoX", jnp.zeros((2, 3, 4), dtype), None, None)


@pytest.mark.parametrize("name", ["segment_ids", "positions"])
def test_segment_ids_and_positions_must_match_batch_and_length(name):
    x = jnp.zeros((2, 5, 8))
    for shape in ((2, 4), (1, 5), (5, 2), (2, 5, 1), (5,), (2, 5, 8)):
        arguments = {"segment_ids": None, "positions": None, name: jnp.zeros(shape, jnp.int32)}
        with pytest.raises(ValueError, match=rf"^Softmax: {name} must have shape \(2, 5\) "
                                             rf"\(x's \[batch, length\]\), got "
                                             + re.escape(str(shape)) + "$"):
            check_mixer_inputs("Softmax", x, arguments["segment_ids"], arguments["positions"])


@pytest.mark.parametrize("name", ["segment_ids", "positions"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.bool_])
def test_segment_ids_and_positions_must_be_integers(name, dtype):
    x = jnp.zeros((2, 5, 8))
    good = jnp.zeros((2, 5), jnp.int32)
    arguments = {"segment_ids": good, "positions": good, name: jnp.zeros((2, 5), dtype)}
    with pytest.raises(TypeError, match=rf"^DCP: {name} must be an integer array, got dtype "
                                        rf"{jnp.dtype(dtype).name}$"):
        check_mixer_inputs("DCP", x, arguments["segment_ids"], arguments["positions"])


def test_the_first_mistake_is_named_and_shapes_are_checked_under_tracing():
    x = jnp.zeros((2, 5, 8))
    # segment_ids before positions; each argument's shape before its dtype
    with pytest.raises(ValueError, match="^L: segment_ids must have shape"):
        check_mixer_inputs("L", x, jnp.zeros((2, 4), jnp.float32), jnp.zeros((2, 4)))
    with pytest.raises(TypeError, match="^L: segment_ids must be an integer array"):
        check_mixer_inputs("L", x, jnp.zeros((2, 5)), jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match="^L: positions must have shape"):
        check_mixer_inputs("L", x, jnp.zeros((2, 5), jnp.int32), jnp.zeros((2, 4), jnp.int32))
    # under jit the shapes and dtypes are known while tracing: the same errors, at trace time
    with pytest.raises(ValueError, match="^L: positions must have shape"):
        jax.jit(lambda x, p: check_mixer_inputs("L", x, None, p))(x, jnp.zeros((5, 2), jnp.int32))
    jax.jit(lambda x, s, p: check_mixer_inputs("L", x, s, p))(
        x, jnp.zeros((2, 5), jnp.int32), jnp.zeros((2, 5), jnp.int32))
