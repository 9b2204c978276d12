"""`supports` of the "pallas" entry of `gdn_jax.ops.short_conv.REGISTRY` (op "short_conv"),
whose forward and backward are `forward.conv_forward_pass` and `backward.conv_backward_pass`;
the op module builds its table from them.

Runs on a Hopper GPU (or the CPU in GPU interpret mode, for tests) with 16-bit activations
(float32 only when interpreting), at most PAD + 1 taps, and heads of 64 or 128 channels
(normalize_heads) or a multiple of 64 channels; otherwise `supports` says why not and the
default (implementation=None) falls back to "xla".
"""

from mixer_core.registry import mosaic_gpu_reason
from mixer_kernels.mosaic_gpu.short_conv.backward import conv_backward_pass
from mixer_kernels.mosaic_gpu.short_conv.common import GROUP, PAD, SUPPORTED_HEAD_DIMS, head_width
from mixer_kernels.mosaic_gpu.short_conv.forward import conv_forward_pass

def supports(**facts):
    """None if the kernel runs on these inputs, else the reason."""
    reason = mosaic_gpu_reason(facts, "activations")
    if reason is not None:
        return reason
    if facts.get("kernel_size", 0) > PAD + 1:
        return f"needs at most {PAD + 1} taps, got {facts.get('kernel_size')}"
    channels, heads = facts.get("channels", 0), facts.get("normalize_heads")
    width = head_width(channels, heads)
    if heads is not None and width not in SUPPORTED_HEAD_DIMS:
        return f"needs normalised heads of {SUPPORTED_HEAD_DIMS} channels, got {width}"
    if heads is None and channels % GROUP:
        return f"needs a multiple of {GROUP} channels, got {channels}"
    return None


__all__ = ["conv_backward_pass", "conv_forward_pass", "supports"]
