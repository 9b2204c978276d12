"""Small probe models: embedding, pre-norm attention (+ MLP) blocks, linear readout.

    x_0    = E[tokens]                                    [B, T, D]
    per layer l:  x <- x + attention_l(h);  x <- x + MLP(LayerNorm(x))  (mlp=True)
                  h = LayerNorm(x), or with token_shift h_t + s_l * h_{t-1} (h_0 unshifted;
                  s_l [D] learned, initialised to 0)
    logits = LayerNorm(x) @ W_out + b_out                 float32 [B, T, V]

token_shift gives every method the same channel to the previous token inside a layer (as a
short convolution or token shift in a block would), so that a layer whose attention has no
notion of order, such as FPA without its bias, can still find the token before it.

`attention_l` is chosen by METHODS[method](layer_index, num_heads, head_dim): FPA and its
ablations, FoX, softmax (RoPE / NoPE / ALiBi), Selective Attention, DCP, and FPA with the bias
off in the first layer ("fpa_nobias1", meaningful with layers >= 2).
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

from fpa_jax import layers as attention


def _fpa(index, num_heads, head_dim, **switches):
    return attention.FPAAttention(num_heads=num_heads, head_dim=head_dim, **switches)


def _fpa_nobias_first(index, num_heads, head_dim):
    return attention.FPAAttention(num_heads=num_heads, head_dim=head_dim, use_bias=index > 0)


def _softmax(index, num_heads, head_dim, position):
    return attention.SoftmaxAttention(num_heads=num_heads, head_dim=head_dim, position=position)


METHODS: dict[str, Callable[[int, int, int], nn.Module]] = {
    "fpa": _fpa,
    "fpa_key_level_off": partial(_fpa, key_level=False),
    "fpa_query_level": partial(_fpa, query_level=True),
    "fpa_content_off": partial(_fpa, content=False),
    "fpa_stack": partial(_fpa, stack_form=True),
    "fpa_dipsum": partial(_fpa, dip_sum=True),
    "fpa_nobias1": _fpa_nobias_first,
    "fox": lambda i, h, d: attention.FoXAttention(num_heads=h, head_dim=d),
    "softmax_rope": partial(_softmax, position="rope"),
    "softmax_nope": partial(_softmax, position="nope"),
    "softmax_alibi": partial(_softmax, position="alibi"),
    "selective": lambda i, h, d: attention.SelectiveAttention(num_heads=h, head_dim=d),
    "selective_nope": lambda i, h, d: attention.SelectiveAttention(num_heads=h, head_dim=d,
                                                                   position="nope"),
    "dcp": lambda i, h, d: attention.DCPAttention(num_heads=h, head_dim=d),
}


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")


class ProbeModel(nn.Module):
    """tokens [B, T] int -> logits float32 [B, T, vocab_size]; see the module docstring."""

    vocab_size: int
    model_dim: int
    attentions: Sequence[nn.Module]
    mlp: bool = True
    token_shift: bool = False

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab_size, self.model_dim, name="embed")(tokens)
        for index, layer in enumerate(self.attentions):
            h = nn.LayerNorm(name=f"norm_attention_{index}")(x)
            if self.token_shift:
                s = self.param(f"shift_{index}", nn.initializers.zeros, (self.model_dim,))
                h = h + s * jnp.pad(h[:, :-1], ((0, 0), (1, 0), (0, 0)))
            x = x + layer(h)
            if self.mlp:
                y = nn.LayerNorm(name=f"norm_mlp_{index}")(x)
                y = nn.Dense(4 * self.model_dim, name=f"mlp_in_{index}")(y)
                x = x + nn.Dense(self.model_dim, name=f"mlp_out_{index}")(nn.gelu(y))
        x = nn.LayerNorm(name="norm_out")(x)
        return nn.Dense(self.vocab_size, name="readout")(x).astype(jnp.float32)


def build_model(method: str, vocab_size: int, *, model_dim: int, num_layers: int,
                num_heads: int, head_dim: int, mlp: bool = True,
                token_shift: bool = False) -> ProbeModel:
    check_method(method)
    make = METHODS[method]
    return ProbeModel(vocab_size=vocab_size, model_dim=model_dim, mlp=mlp,
                      token_shift=token_shift,
                      attentions=tuple(make(i, num_heads, head_dim) for i in range(num_layers)))
