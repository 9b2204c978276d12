"""Flax Linen attention layers: FPA and the attention baselines it is compared with.

Every layer maps x [B, T, D] to y [B, T, D] with causal multi-head attention:

    q, k, v = x @ W_query, x @ W_key, x @ W_value          [B, T, H, head_dim]  (W_*: [D, H, head_dim])
    o       = attention_op(q, k, v, <layer-specific bias>)  [B, T, H, head_dim]
    y       = o @ W_out                                     [B, T, D]            (W_out: [H, head_dim, D])

with scale 1/sqrt(head_dim). One module per layer (the layer-specific part):

    fpa.py        FPAAttention        field/level path-minimum bias (fpa_attention; no RoPE)
    fox.py        FoXAttention        summed log forget gates (fox_attention; no RoPE)
    softmax.py    SoftmaxAttention    RoPE ("rope"), nothing ("nope") or ALiBi ("alibi")
    selective.py  SelectiveAttention  layer-shared mask from head 0's logits (dense-only)
    dcp.py        DCPAttention        layer-shared low-rank keep mask (dense-only)
    common.py     projections, initialisers, RoPE positions and the checks they share

`__call__(x, *, segment_ids=None, positions=None)` for every layer (and for
gdn_jax.GatedDeltaNet): segment_ids [B, T] int marks packed documents (equal id = same document,
documents contiguous; no attention across them); positions [B, T] int feed RoPE and default to
0, 1, 2, ... restarting at every document start (layers without RoPE ignore them).

`implementation` (a field of every layer) is checked at init against the registry of the op
the layer calls (`layer.op_name`, `fpa_jax.REGISTRIES`).
"""

from fpa_jax.layers.common import per_head_forget_values, positions_within_segments
from fpa_jax.layers.dcp import DCPAttention
from fpa_jax.layers.fox import FoXAttention
from fpa_jax.layers.fpa import FPAAttention
from fpa_jax.layers.selective import SelectiveAttention
from fpa_jax.layers.softmax import SoftmaxAttention

__all__ = ["DCPAttention", "FPAAttention", "FoXAttention", "SelectiveAttention",
           "SoftmaxAttention", "per_head_forget_values", "positions_within_segments"]
