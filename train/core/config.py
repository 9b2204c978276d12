"""The run configuration's schema: frozen dataclasses, one per section (model, attention, gdn,
data, optim, mesh, train, cpt), their defaults and the names they allow.

Layer pattern: `model.pattern` is a string over {A, G} (A = the configured attention variant,
G = GatedDeltaNet) whose length divides `model.num_layers`; it is tiled to one letter per layer.

The attention kinds, and what each allows, are the mixer table's (train/core/mixers.py).
Presets and overrides become a Config in train/core/presets.py; train/core/validation.py
refuses impossible combinations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

MIXER_LETTERS = {"A": "attention", "G": "gdn"}
CPT_POSITIONS = ("keep", "abf", "yarn", "drope")   # train/experiments/cpt.py extended_attention
DTYPES = ("float32", "bfloat16")


class ConfigError(ValueError):
    """A configuration that cannot run: unknown key, wrong type or impossible combination."""


def require(condition: bool, message: str) -> None:
    """ConfigError(message) unless `condition`."""
    if not condition:
        raise ConfigError(message)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 0            # 0: the tokenizer's vocabulary, padded to vocab_multiple
    vocab_multiple: int = 64
    d_model: int = 32
    num_layers: int = 2
    pattern: str = "A"             # tiled over the layers, e.g. "GGGA"
    mlp_dim: int = 0               # 0: 8/3 * d_model rounded up to a multiple of 32
    tie_embeddings: bool = True
    norm_eps: float = 1e-6
    init_std: float = 0.02
    dtype: str = "float32"         # compute dtype
    param_dtype: str = "float32"
    remat: bool = False            # rematerialise each block in the backward pass
    scan_layers: bool = False      # run the blocks as one lax.scan over the pattern's repeats
                                   # (one compiled period; train/core/model.py)
    moe_experts: int = 0           # 0: dense SwiGLU FFN; > 0: every FFN is a MoE (train/core/moe.py)
    moe_top_k: int = 2             # experts per token
    moe_expert_dim: int = 0        # hidden width of each expert; 0: mlp_dim
    moe_capacity_factor: float = 0.0  # 0: dropless; c > 0: ceil(c N k / E) slots per expert
    moe_aux_loss_coef: float = 0.01   # load-balancing loss weight (sown per token, train/core/moe.py)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    kind: str = "fpa"
    num_heads: int = 2
    head_dim: int = 16
    position: str = "nope"         # rope|nope|alibi (softmax), rope|nope (selective)
    rope_base: float = 10000.0
    yarn_factor: float = 0.0       # 0: off; else YaRN RoPE scaling by this factor (softmax, rope)
    yarn_original_length: int = 0  # YaRN's original context (the length trained without it)
    implementation: str | None = None
    block_size: int | None = None  # fpa, fox, softmax: the op's block (None: its default; a
                                   # multiple of 8): "xla" key block, ring query tile
    no_bias_layers: tuple[int, ...] = ()   # FPA layers (0-based model layer index) without bias
    # FPA variants (docs/fpa.md, "Special cases")
    stack_form: bool = False
    key_level: bool = True
    query_level: bool = False
    content: bool = True
    dip_sum: bool = False
    tau: float = 1.0


@dataclasses.dataclass(frozen=True)
class GDNConfig:
    num_heads: int = 2
    head_dim: int = 16
    num_v_heads: int = 0           # 0: num_heads
    v_head_dim: int = 0            # 0: head_dim
    conv_size: int = 4
    implementation: str | None = None


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: str = "stdlib"
    tokenizer: str = "byte"        # "byte" or a path to a saved tokenizer
    seq_len: int = 64
    batch_size: int = 8            # global batch (sequences per step over all devices)
    heldout_fraction: float = 0.02
    seed: int = 0
    max_documents: int = 0         # 0: every document of the source
    shuffle: str = "global"        # train rows: "global" (grain's per-epoch shuffle of every
                                   # packed row) | "window" (shuffle_window rows at a time)
    shuffle_window: int = 64       # rows per window of the "window" shuffle


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"            # adamw | muon | sgd
    lr: float = 1e-3
    schedule: str = "cosine"       # cosine (linear warmup, cosine decay) | constant (after warmup)
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1      # cosine end value as a fraction of lr
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    momentum: float = 0.95         # muon momentum
    clip_norm: float = 1.0         # global-norm clipping; 0 disables
    alpha_lr_scale: float = 1.0    # lr multiplier of the GDN alpha projection kernels
    freeze_gdn_decay: bool = False  # A_log and dt_bias get zero updates


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = -1                 # -1: all devices left after fsdp * tensor * context
    fsdp: int = 1
    tensor: int = 1
    context: int = 1               # n > 1: context parallelism, each sequence split into n equal
                                   # stretches of data.seq_len / n tokens on n devices (ring
                                   # attention for fpa / fox / softmax, the context-parallel delta
                                   # rule for GDN; mixer_core/shard.py ring_or_shard); a stretch
                                   # that is a multiple of 64 (the GDN chunk) wastes no padding


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0            # 0: only at the end
    eval_batches: int = 4
    position_buckets: int = 8      # per-position eval loss: equal-width buckets of doc position
    checkpoint_every: int = 50     # 0: only the final checkpoint
    keep_checkpoints: int = 3
    run_dir: str = ""              # "": runs/<preset>[-<hash of the overrides>] (train/core/runs.py)
    tensorboard: bool = True
    on_nonfinite: str = "stop"     # non-finite loss/grad norm: "stop" the run, or "skip" the step
                                   # (non-finite parameters stop the run either way)
    grad_accum: int = 1            # micro-batches per step: data.batch_size / grad_accum rows
                                   # each, gradients summed (same loss and update as one batch)
    check_ranges: bool = False     # op argument ranges checked inside jit (checkify; slower)
    init_on: str = "host"          # the initial state drawn by the "host" CPU, then placed on
                                   # the devices (its compile: 6 s on an H200 machine, against
                                   # 51 s for the same program on the GPU), or on the "device"s
                                   # (a state too large for one host's memory)
    compile_cache: str = "run"     # persistent compilation cache: "run" (<run_dir>/compile_cache),
                                   # "off", or a directory shared by runs (compile_cache.py)


@dataclasses.dataclass(frozen=True)
class CPTConfig:
    reference: str = ""            # run directory (or checkpoint directory) of the reference run
    l_ref: int = 0                 # 0: the reference run's data.seq_len
    l_tar: int = 0                 # 0: this run's data.seq_len
    k: float = 0.5
    mode: str = "matrix"           # matrix | row
    reparameterize: bool = True    # apply W_alpha <- mu + s (W_alpha - mu) once
    scale_lr: bool = True          # alpha projection learning rate x s
    reference_step: int = 0        # 0: the reference run's final step (train.steps)
    positions: str = "keep"        # attention RoPE when extending: keep | abf | yarn | drope
    rope_base: float = 0.0         # abf: the new base (0: reference base * r ** (D / (D - 2)))


@dataclasses.dataclass(frozen=True)
class Config:
    name: str = "run"
    model: ModelConfig = ModelConfig()
    attention: AttentionConfig = AttentionConfig()
    gdn: GDNConfig = GDNConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    mesh: MeshConfig = MeshConfig()
    train: TrainConfig = TrainConfig()
    cpt: CPTConfig = CPTConfig()

    def layer_sections(self) -> tuple[str, ...]:
        """The config section of every layer's mixer, "attention" | "gdn", from the tiled
        pattern (the mixer kinds: train/core/mixers.py `layer_kinds`)."""
        repeats = self.model.num_layers // len(self.model.pattern)
        return tuple(MIXER_LETTERS[letter] for letter in self.model.pattern * repeats)

    def mlp_dim(self) -> int:
        if self.model.mlp_dim:
            return self.model.mlp_dim
        return -(-(8 * self.model.d_model // 3) // 32) * 32

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_to_plain(v) for v in value]
    return value


NOT_SET = "(unset)"     # config_differences: the side of a key that one config lacks


def flat_keys(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a.b.c": value} for a nested mapping (the dotted keys of config overrides)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flat_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(old: Mapping[str, Any],
                       new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old value, new value)}, sorted by key, for every key whose value differs
    between two config dicts (`Config.to_dict()`, or a run's saved config.json); a key one
    side lacks counts as None there and is shown as NOT_SET."""
    before, after = flat_keys(old), flat_keys(new)
    return {key: (before.get(key, NOT_SET), after.get(key, NOT_SET))
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)}


def changed_from_preset(preset: Config, config: Config) -> dict[str, Any]:
    """{dotted key: value in `config`} where it differs from `preset` (train.run_dir aside)."""
    return {key: value for key, (_, value)
            in config_differences(preset.to_dict(), config.to_dict()).items()
            if key != "train.run_dir"}
