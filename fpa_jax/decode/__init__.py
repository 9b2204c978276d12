"""Decoding caches with slot reuse for the attention layers (one token at a time).

    slots.py     SlotCache: keys/values per (batch row, head) in reusable slots, live mask,
                 first-free-slot writes, compaction and resizing
    additive.py  additive per-step bias rule (FoX log forget gates, ALiBi; none for RoPE/NoPE)
    layers.py    prefill / step / eviction of FPAAttention, FoXAttention, SoftmaxAttention

FPA's own bias rule (range minimum or dip sum) is fpa_jax/fpa/decoding.py; the language
model's prefill and decode step (with GatedDeltaNet) are in train/generate/.
"""
