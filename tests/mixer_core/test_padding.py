"""Padding the time axis up to whole blocks (mixer_core/padding.py): lengths round up to a
multiple of the block, padded entries take the given value, padded segment ids are their own
document."""

import jax.numpy as jnp
import numpy as np

from mixer_core.padding import PAD_SEGMENT_ID, pad_segment_ids, pad_time, padded_length


def test_padded_length_rounds_up_to_whole_blocks():
    assert [padded_length(length, 4) for length in (1, 3, 4, 5, 8, 9)] == [4, 4, 4, 8, 8, 12]
    assert padded_length(0, 4) == 0


def test_pad_time_fills_the_end_of_the_axis():
    x = jnp.arange(6.0).reshape(1, 2, 3)
    assert pad_time(x, 2) is x
    np.testing.assert_array_equal(pad_time(x, 4, axis=1, value=-1.0)[0, 2:], -np.ones((2, 3)))
    np.testing.assert_array_equal(pad_time(x, 5, axis=2)[..., :3], x)
    assert pad_time(x, 5, axis=2).shape == (1, 2, 5)


def test_padding_is_its_own_document():
    segment_ids = jnp.asarray([[4, 4, 7]], jnp.int16)
    padded = pad_segment_ids(segment_ids, 6)
    assert padded.dtype == jnp.int32
    np.testing.assert_array_equal(padded, [[4, 4, 7] + [PAD_SEGMENT_ID] * 3])
    assert pad_segment_ids(None, 6) is None
