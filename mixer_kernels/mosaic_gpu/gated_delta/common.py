"""Constants shared by the gated delta rule's kernels (their Mosaic GPU helpers:
mixer_kernels/mosaic_gpu/common.py).

    CHUNK                the chunk length C of the WY form (the op's chunk_size must equal it)
    SMEM_BYTES           an H200 block's shared memory (227 KiB)
    SUPPORTED_HEAD_DIMS  key / value head dims the kernels are built for
    head_sizes(qk_shape, num_v_heads, value_dim)   (batch, num_heads, key_dim, num_v_heads,
                         value_dim, group) of q / k [B, Tp, H, K] read by HV value heads of
                         dim V, group = HV // H query/key heads sharing each q / k head
    check_smem(kernel, need, key_dim, value_dim)   a clear error when a block needs more
                         shared memory than SMEM_BYTES
    summed_over_group(x, like)   a kernel's q- or k-shaped cotangent [B, Tp, HV, K] (per value
                         head for grouped heads) as like's [B, Tp, H, K] in like's dtype
    per_chunk(kernel, name, out_type, scratch, grid_shape, interpret)
                         plgpu.kernel with one block per (chunk, value head, batch), its body
                         named in profiles
"""

from jax.experimental.pallas import mosaic_gpu as plgpu

CHUNK = 64
SMEM_BYTES = 232448
SUPPORTED_HEAD_DIMS = (64, 128, 256)


def head_sizes(qk_shape, num_v_heads, value_dim):
    batch, _, num_heads, key_dim = qk_shape
    return batch, num_heads, key_dim, num_v_heads, value_dim, num_v_heads // num_heads


def check_smem(kernel: str, need: int, key_dim: int, value_dim: int) -> None:
    if need > SMEM_BYTES:
        raise ValueError(f"the {kernel} needs {need} bytes of shared memory for K = {key_dim}, "
                         f"V = {value_dim}, more than {SMEM_BYTES}")


def summed_over_group(x, like):
    """x [B, Tp, HV, K]: float32 partials per value head summed over each group of HV // H,
    or (group 1) already like's shape; returned in like's dtype."""
    if x.shape[2] != like.shape[2]:
        x = x.reshape(*like.shape[:3], -1, like.shape[3]).sum(3)
    return x.astype(like.dtype)


def per_chunk(kernel, name, out_type, scratch, grid_shape, interpret):
    """`kernel` launched with one block per (chunk "c", value head "hv", batch "b") of
    grid_shape = (N, HV, B), named `name` in profiles; returns the launch (call it on the
    operands)."""
    kernel.__name__ = name
    return plgpu.kernel(kernel, out_type=out_type, scratch_types=scratch, grid=grid_shape,
                        grid_names=("c", "hv", "b"), interpret=interpret)
