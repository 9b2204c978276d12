"""PyTorch FPA language model for Hugging Face transformers' remote code: dense math, no kernel.

Copied next to the weights by `python -m train export RUN --format fpa-torch`; imports only
torch and transformers (and configuration_fpa.py beside it). It computes what the JAX model
of the training project computes, for one document per row:

    x      = E[input_ids]                                               [B, T, D]
    per layer:  x <- x + o_proj(Attention(RMSNorm(x)))
                x <- x + down_proj(silu(gate_proj(n)) * up_proj(n)),   n = RMSNorm(x)
    logits = RMSNorm(x) E^T  (tie_word_embeddings)  or  RMSNorm(x) lm_head^T    float32 [B, T, V]
    RMSNorm(x) = x / sqrt(mean(x^2) + norm_eps) * weight     (statistics in float32)

Attention of an FPA layer, per head (no positional encoding):
    delta, g, h = x delta_proj^T + b, x field_proj^T + b, x level_proj^T + b    float32 [B, H, T]
                  (g = 0 with stack_form; h = 0 with stack_form or key_level false)
    W_t = sum_{u<=t} delta_u,   phi = W + g,   psi = W + h,   beta = softplus(rho)
    b_ts = beta * min(0, min_{s<u<=t} phi_u - psi_s)    for s < t, b_tt = 0
           (psi_t instead of psi_s with query_level; beta * sum_{s<u<=t} min(0, phi_u - psi_s)
           with dip_sum)
    logit_ts = q_t.k_s / sqrt(head_dim) + b_ts   for s <= t   (no q.k term without content)
    out_t = sum_s softmax_s(logit_t.) v_s        (float32), heads concatenated
A layer in `no_bias_layers` has the q.k logits alone. Memory is O(B H T^2) per layer.

attention_mask [B, T] (1 = token, 0 = padding) hides padded keys; left or right padding gives
the logits of the unpadded rows (the walk's offset from padding cancels in phi_u - psi_s).
Differences from the JAX training code: no packed documents (segment ids); the gradient of
the range minimum is the hard minimum's, not JAX's straight-through soft minimum (tau);
generate() has no KV cache and re-runs the whole sequence at every step.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

from .configuration_fpa import FPAConfig


class FPARMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32, returned in x's dtype."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        scale = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return (x32 * scale).to(x.dtype)


class FPAMLP(nn.Module):
    """SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _later(length, device):
    """[T(s), T(u)] bool: u > s."""
    index = torch.arange(length, device=device)
    return index[None, :] > index[:, None]


def range_minimum(phi):
    """phi [B, H, T] -> [B, H, T(t), T(s)]: min_{s<u<=t} phi_u, +inf where t <= s."""
    rows = torch.where(_later(phi.shape[-1], phi.device), phi[..., None, :], torch.inf)
    return rows.cummin(-1).values.transpose(-1, -2)


def dip_sum(phi, psi):
    """phi, psi [B, H, T] -> [B, H, T(t), T(s)]: sum_{s<u<=t} min(0, phi_u - psi_s)."""
    dips = (phi[..., None, :] - psi[..., :, None]).clamp(max=0)          # [B, H, s, u]
    dips = torch.where(_later(phi.shape[-1], phi.device), dips, 0.0)
    return dips.cumsum(-1).transpose(-1, -2)


def fpa_bias(phi, psi, beta, fpa):
    """The FPA bias b_ts [B, H, T(t), T(s)] (module docstring); 0 where t <= s, whose range
    s < u <= t is empty (the range minimum is +inf there, the dip sum 0)."""
    if fpa["dip_sum"]:
        return beta[:, None, None] * dip_sum(phi, psi)
    level = psi[..., :, None] if fpa["query_level"] else psi[..., None, :]
    return beta[:, None, None] * (range_minimum(phi) - level).clamp(max=0)


class FPAAttention(nn.Module):
    """Causal FPA attention of one layer (module docstring); float32 inside."""

    def __init__(self, config, layer_idx):
        super().__init__()
        fpa = config.fpa
        self.fpa = fpa
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.use_bias = layer_idx not in fpa["no_bias_layers"]
        self.content = fpa["content"] or not self.use_bias
        width, hidden = config.num_heads * config.head_dim, config.hidden_size
        if self.content:
            self.q_proj = nn.Linear(hidden, width, bias=False)
            self.k_proj = nn.Linear(hidden, width, bias=False)
        self.v_proj = nn.Linear(hidden, width, bias=False)
        self.o_proj = nn.Linear(width, hidden, bias=False)
        if self.use_bias:
            self.delta_proj = nn.Linear(hidden, config.num_heads)
            if not fpa["stack_form"]:
                self.field_proj = nn.Linear(hidden, config.num_heads)
                if fpa["key_level"]:
                    self.level_proj = nn.Linear(hidden, config.num_heads)
            self.rho = nn.Parameter(torch.full((config.num_heads,), math.log(math.expm1(1.0))))

    def _heads(self, y):
        """[B, T, H*Dh] -> float32 [B, H, T, Dh]."""
        batch, length, _ = y.shape
        return y.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2).float()

    def _scalar_map(self, name, x32):
        """float32 [B, H, T]: x proj^T + b of the projection `name`, zeros where it is absent."""
        if not hasattr(self, name):
            return x32.new_zeros(x32.shape[0], self.num_heads, x32.shape[1])
        proj = getattr(self, name)
        return F.linear(x32, proj.weight.float(), proj.bias.float()).transpose(1, 2)

    def forward(self, x, allowed):
        """x [B, T, D], allowed [B or 1, 1, T, T] bool (query t may see key s) -> [B, T, D]."""
        logits = 0.0
        if self.content:
            q, k = self._heads(self.q_proj(x)), self._heads(self.k_proj(x))
            logits = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        if self.use_bias:
            x32 = x.float()
            walk = self._scalar_map("delta_proj", x32).cumsum(-1)
            phi = walk + self._scalar_map("field_proj", x32)
            psi = walk + self._scalar_map("level_proj", x32)
            logits = logits + fpa_bias(phi, psi, F.softplus(self.rho.float()), self.fpa)
        weights = logits.masked_fill(~allowed, -torch.inf).softmax(-1)
        out = weights @ self._heads(self.v_proj(x))                          # [B, H, T, Dh]
        return self.o_proj(out.transpose(1, 2).flatten(2).to(x.dtype))


class FPABlock(nn.Module):
    """Pre-norm block: attention then SwiGLU, each added to the residual stream."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_norm = FPARMSNorm(config.hidden_size, config.norm_eps)
        self.attn = FPAAttention(config, layer_idx)
        self.mlp_norm = FPARMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = FPAMLP(config)

    def forward(self, x, allowed):
        x = x + self.attn(self.attn_norm(x), allowed)
        return x + self.mlp(self.mlp_norm(x))


class FPAPreTrainedModel(PreTrainedModel):
    config_class = FPAConfig
    base_model_prefix = "model"
    _no_split_modules = ["FPABlock"]


def visible_keys(attention_mask, length, device):
    """[B or 1, 1, T, T] bool: key s is at or before query t and, with attention_mask, not
    padding (a padded query still sees itself, so no row is empty)."""
    allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]
    if attention_mask is None:
        return allowed
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    return allowed & (attention_mask.bool()[:, None, None, :] | diagonal)


class FPAModel(FPAPreTrainedModel):
    """input_ids [B, T] -> last_hidden_state [B, T, D] (after the final RMSNorm)."""

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(FPABlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = FPARMSNorm(config.hidden_size, config.norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings

    def set_input_embeddings(self, value):
        self.embeddings = value

    def forward(self, input_ids, attention_mask=None, **kwargs):
        """Keyword arguments other than attention_mask (e.g. use_cache) are ignored."""
        x = self.embeddings(input_ids)
        allowed = visible_keys(attention_mask, input_ids.shape[1], input_ids.device)
        for layer in self.layers:
            x = layer(x, allowed)
        return BaseModelOutput(last_hidden_state=self.norm(x))


class FPAForCausalLM(FPAPreTrainedModel, GenerationMixin):
    """input_ids [B, T] -> float32 logits [B, T, V]; tied embeddings have no lm_head module."""

    def __init__(self, config):
        super().__init__(config)
        self.model = FPAModel(config)
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embeddings

    def set_input_embeddings(self, value):
        self.model.embeddings = value

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, attention_mask=None, **kwargs):
        """Keyword arguments other than attention_mask (generate's use_cache, return_dict,
        ...) are ignored: there is no KV cache."""
        hidden = self.model(input_ids, attention_mask).last_hidden_state
        head = self.model.embeddings if self.lm_head is None else self.lm_head
        return CausalLMOutput(logits=F.linear(hidden, head.weight).float())

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """Every generation step runs the whole sequence (no KV cache)."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}
