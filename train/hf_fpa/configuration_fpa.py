"""Hugging Face config of an FPA language model (`model_type` "fpa_transformer").

Copied next to the weights by `python -m train export RUN --format fpa-torch`, which writes
config.json with `auto_map` pointing here, so that
`AutoConfig.from_pretrained(dir, trust_remote_code=True)` builds this class. Imports only
transformers. Keys of config.json this class does not name (e.g. the training project's own
copy of its config) are kept as attributes, as transformers does for any config.
"""

from transformers import PretrainedConfig

FPA_SWITCHES = {"stack_form": False, "key_level": True, "query_level": False, "content": True,
                "dip_sum": False, "tau": 1.0, "no_bias_layers": ()}


class FPAConfig(PretrainedConfig):
    """Hyperparameters of `FPAForCausalLM` (modeling_fpa.py).

    hidden_size D, num_hidden_layers, intermediate_size F (SwiGLU width), num_heads H and
    head_dim Dh of every attention layer (H * Dh need not equal D), norm_eps of every RMSNorm,
    vocab_size V, tie_word_embeddings (logits = h E^T, no lm_head tensor).
    fpa: the FPA switches, FPA_SWITCHES's keys (missing keys take those defaults):
        stack_form      g = h = 0 (no field_proj / level_proj tensors)
        key_level       False: h = 0 (no level_proj)
        query_level     the bias compares the range minimum with psi_t instead of psi_s
        content         False: no q.k term (no q_proj / k_proj); the logit is the bias alone
        dip_sum         the bias sums the dips over the path instead of taking the minimum
        tau             soft-minimum temperature of the training gradient; unused here
        no_bias_layers  layer indices that are plain causal softmax attention (no positions)
    """

    model_type = "fpa_transformer"

    def __init__(self, vocab_size=256, hidden_size=512, num_hidden_layers=8,
                 intermediate_size=1376, num_heads=8, head_dim=64, norm_eps=1e-6, fpa=None,
                 tie_word_embeddings=True, initializer_range=0.02, **kwargs):
        fpa = {**FPA_SWITCHES, **(fpa or {})}
        unknown = sorted(set(fpa) - set(FPA_SWITCHES))
        if unknown:
            raise ValueError(f"fpa: unknown switches {unknown}; known: {sorted(FPA_SWITCHES)}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.intermediate_size = intermediate_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.norm_eps = norm_eps
        self.fpa = fpa
        self.initializer_range = initializer_range
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
