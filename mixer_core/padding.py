"""Padding the time axis up to whole blocks: one rule for every blocked path (the kernels'
wrappers, the blocked XLA paths, the ring functions).

    padded_length(T, n)                n * ceil(T / n)
    pad_time(x, Tp, axis=1, value=0)   x [..., T (at axis), ...] -> [..., Tp, ...]; new = value
    pad_segment_ids(ids, Tp)           ids [B, T] int -> int32 [B, Tp]; new = PAD_SEGMENT_ID

Padded positions form their own document (id PAD_SEGMENT_ID = int32 min, which real ids are
assumed never to use), so no real query ever sees a padded key and no padded row is left
without a key (it sees itself). The blocked FPA path (`fpa_jax.fpa.xla`) and the blocked
softmax core (`fpa_jax.baselines.flash_xla`) both pad this way; padded rows are sliced off.
"""

import jax.numpy as jnp

PAD_SEGMENT_ID = int(jnp.iinfo(jnp.int32).min)


def padded_length(length, block_size):
    """`length` rounded up to a multiple of `block_size`."""
    return -(-length // block_size) * block_size


def pad_time(x, length, axis=1, value=0):
    """Pad x along `axis` at the end up to `length` with `value` (no copy if already there)."""
    pad = length - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def pad_segment_ids(segment_ids, length):
    """segment_ids [B, T] int or None -> int32 [B, length]; padding is its own document."""
    if segment_ids is None:
        return None
    return pad_time(segment_ids.astype(jnp.int32), length, value=PAD_SEGMENT_ID)
