"""Typed run configuration: YAML preset + dotted key=value overrides -> validated dataclasses.

    config = load_config("configs/tiny_fpa.yaml", ["model.num_layers=4", "optim.lr=1e-3"])

    preset YAML  --resolve `base:` chain-->  dict  --coerce, validate-->  Config (the preset's)
                 --merge overrides-->  dict  --coerce, validate-->  Config (the run's)
    unknown key, wrong type, impossible combination  ->  ConfigError naming the dotted key

Inheritance: a preset may name the preset it extends, `base: <name or path>` (looked up beside
the file, then in configs/; configs/base/ holds shared bases that are not presets themselves).
resolved(preset) = deep_merge(resolved(base), preset without `base`): mappings merge key by
key, anything else (scalars, lists) replaces. `name` is never inherited: it is the preset's own
`name`, else its file stem. The resolved preset is validated before the overrides are applied,
and the run directory stores the fully resolved config (config.json, `Config.to_dict`).

Implementations: `attention.implementation` / `gdn.implementation` are checked at load
against the dispatch registry of the op each layer calls (`fpa_jax.REGISTRIES`,
`gdn_jax.REGISTRIES`; the layer names its op), so e.g. selective attention with "xla" is
refused here, not when the model is traced.

Layer pattern: `model.pattern` is a string over {A, G} (A = the configured attention variant,
G = GatedDeltaNet) whose length divides `model.num_layers`; it is tiled to one letter per layer.

Warm-up of a shorter run: the cosine schedule needs optim.warmup_steps < train.steps. When an
override lowers train.steps to or below the preset's warm-up and optim.warmup_steps is not
overridden too, the warm-up keeps the preset's share of the run,
warmup = preset warmup * steps // preset steps, and a `note:` line on stderr says so; an
explicit optim.warmup_steps >= train.steps is refused naming both keys.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml

ATTENTION_KINDS = ("fpa", "fox", "softmax", "selective", "dcp")
POSITIONS_BY_KIND = {
    "fpa": ("nope",),
    "fox": ("nope",),
    "dcp": ("nope",),
    "softmax": ("rope", "nope", "alibi"),
    "selective": ("rope", "nope"),
}
MIXER_LETTERS = {"A": "attention", "G": "gdn"}
CPT_POSITIONS = ("keep", "abf", "yarn", "drope")   # train/experiments/cpt.py extended_attention
CONTEXT_PARALLEL_KINDS = ("fpa", "fox", "softmax")  # attention with a ring path (mesh.context > 1)
DTYPES = ("float32", "bfloat16")
BASE_KEY = "base"
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


class ConfigError(ValueError):
    """A configuration that cannot run: unknown key, wrong type or impossible combination."""


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
                                   # rule for GDN; kernels_pallas/context_shard.py); a stretch
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
    grad_accum: int = 1            # micro-batches per step: data.batch_size / grad_accum rows
                                   # each, gradients summed (same loss and update as one batch)
    check_ranges: bool = False     # op argument ranges checked inside jit (checkify; slower)


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

    def layer_kinds(self) -> tuple[str, ...]:
        """One of "attention" | "gdn" per layer, from the tiled pattern."""
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


# ---------------------------------------------------------------- loading and overrides


def resolve_preset(path_or_name: str, beside: Path | None = None) -> Path:
    """A YAML path, or a preset name ("tiny_fpa" or "tiny_fpa.yaml", "base/tiny") looked up
    beside the file `beside` (for `base:` keys), then in configs/."""
    candidate = Path(path_or_name)
    if candidate.is_file():
        return candidate
    directories = ([beside.parent] if beside is not None else []) + [CONFIG_DIR]
    for directory in directories:
        for name in (path_or_name, f"{path_or_name}.yaml"):
            preset = directory / name
            if preset.is_file():
                return preset
    available = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
    where = f" (named by `base:` in {beside})" if beside is not None else ""
    raise ConfigError(f"config {path_or_name!r}{where}: no such file or preset "
                      f"(presets: {available})")


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (YAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"{self.name}: line {key_node.start_mark.line + 1}: key "
                                  f"{key!r} appears twice in one mapping")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict[str, Any]:
    """The YAML mapping in `path`; ConfigError for a file that is not UTF-8 text, is empty, is
    no mapping or repeats a key (malformed YAML raises yaml.YAMLError)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a UTF-8 text file ({error.reason} at byte "
                          f"{error.start})") from None
    loader = _UniqueKeyLoader(text)
    loader.name = str(path)
    try:
        loaded = loader.get_single_data()
    finally:
        loader.dispose()
    if loaded is None:
        raise ConfigError(f"{path}: the file is empty (expected a mapping of config sections)")
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(loaded).__name__}")
    return loaded


def _deep_merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    merged = _deep_copy(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = _deep_copy(value)
    return merged


def resolve_preset_dict(path: Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The preset at `path` with its `base:` chain merged in (no `base` key left)."""
    path = path.resolve()
    if path in _chain:
        cycle = " -> ".join(p.name for p in (*_chain, path))
        raise ConfigError(f"{BASE_KEY}: presets extend each other in a cycle ({cycle})")
    raw = _read_yaml(path)
    base = raw.pop(BASE_KEY, None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: {BASE_KEY} must name a preset, got {base!r}")
    inherited = resolve_preset_dict(resolve_preset(base, beside=path), (*_chain, path))
    inherited.pop("name", None)
    return _deep_merge(inherited, raw)


def load_preset(path_or_name: str) -> Config:
    """The fully resolved, validated preset (its `base:` chain merged; no overrides)."""
    path = resolve_preset(path_or_name)
    raw = resolve_preset_dict(path)
    raw.setdefault("name", path.stem)
    return config_from_dict(raw)


def load_config(path_or_name: str | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Resolve and validate a preset (or start from defaults when None), then apply key=value
    overrides and validate the result."""
    raw: dict[str, Any] = {}
    if path_or_name is not None:
        raw = load_preset(path_or_name).to_dict()
    if not overrides:
        return config_from_dict(raw)
    return config_from_dict(_warmup_within_steps(raw, apply_overrides(raw, overrides),
                                                 overrides))


def _warmup_within_steps(preset: dict[str, Any], merged: dict[str, Any],
                         overrides: typing.Sequence[str]) -> dict[str, Any]:
    """`merged` with the preset's warm-up scaled to an overridden train.steps it would not fit
    (module docstring), with a note; unchanged otherwise."""
    keys = {item.partition("=")[0].strip() for item in overrides}
    if "train.steps" not in keys or "optim.warmup_steps" in keys:
        return merged
    optim, train = OptimConfig(), TrainConfig()
    preset_warmup = preset.get("optim", {}).get("warmup_steps", optim.warmup_steps)
    preset_steps = preset.get("train", {}).get("steps", train.steps)
    steps = merged.get("train", {}).get("steps")
    schedule = merged.get("optim", {}).get("schedule", optim.schedule)
    if (schedule != "cosine" or isinstance(steps, bool) or not isinstance(steps, int)
            or steps < 1 or preset_warmup < steps):
        return merged
    warmup = preset_warmup * steps // preset_steps
    print(f"note: optim.warmup_steps={preset_warmup} of the preset is not below train.steps="
          f"{steps}: scaled down to {warmup}, the preset's share of the run ({preset_warmup} "
          f"of {preset_steps} steps); set optim.warmup_steps to choose", file=sys.stderr,
          flush=True)
    merged["optim"] = {**merged.get("optim", {}), "warmup_steps": warmup}
    return merged


def apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[str]) -> dict[str, Any]:
    """Merge "a.b=value" strings (value parsed as YAML) into a nested dict (copy)."""
    merged = _deep_copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. optim.lr=1e-3)")
        value = yaml.safe_load(text) if text.strip() else ""
        node = merged
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return merged


def _deep_copy(raw: Any) -> Any:
    if isinstance(raw, dict):
        return {k: _deep_copy(v) for k, v in raw.items()}
    return raw


def config_from_dict(raw: dict[str, Any]) -> Config:
    config = _build(Config, raw, prefix="")
    validate(config)
    return config


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ConfigError(
            f"unknown config key {prefix + str(unknown[0])!r} (valid keys in "
            f"{prefix.rstrip('.') or 'the top level'}: {', '.join(sorted(fields))})"
        )
    values = {}
    for name, value in raw.items():
        key = prefix + name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, value, key + ".")
        else:
            values[name] = _coerce(value, hint, key)
    return cls(**values)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, key)
    if origin is tuple:
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        raise TypeError(f"config field {key}: unsupported annotation {hint!r}")
    raise ConfigError(f"{key}: expected {hint.__name__}, got {value!r} ({type(value).__name__})")


# ---------------------------------------------------------------- validation


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def validate(config: Config) -> None:
    """Reject impossible combinations before anything starts."""
    m, a, g, d, o, mesh, t, c = (config.model, config.attention, config.gdn, config.data,
                                 config.optim, config.mesh, config.train, config.cpt)
    for key, value in [("model.d_model", m.d_model), ("model.num_layers", m.num_layers),
                       ("model.vocab_multiple", m.vocab_multiple),
                       ("attention.num_heads", a.num_heads), ("attention.head_dim", a.head_dim),
                       ("gdn.num_heads", g.num_heads), ("gdn.head_dim", g.head_dim),
                       ("gdn.conv_size", g.conv_size), ("data.seq_len", d.seq_len),
                       ("data.batch_size", d.batch_size), ("train.steps", t.steps),
                       ("train.log_every", t.log_every), ("train.eval_batches", t.eval_batches),
                       ("train.position_buckets", t.position_buckets),
                       ("train.keep_checkpoints", t.keep_checkpoints),
                       ("train.grad_accum", t.grad_accum),
                       ("data.shuffle_window", d.shuffle_window),
                       ("mesh.fsdp", mesh.fsdp), ("mesh.tensor", mesh.tensor),
                       ("mesh.context", mesh.context)]:
        _require(value >= 1, f"{key} must be >= 1, got {value}")
    for key, value in [("model.vocab_size", m.vocab_size), ("model.mlp_dim", m.mlp_dim),
                       ("gdn.num_v_heads", g.num_v_heads), ("gdn.v_head_dim", g.v_head_dim),
                       ("optim.warmup_steps", o.warmup_steps), ("optim.clip_norm", o.clip_norm),
                       ("optim.weight_decay", o.weight_decay), ("train.eval_every", t.eval_every),
                       ("train.checkpoint_every", t.checkpoint_every),
                       ("data.max_documents", d.max_documents),
                       ("cpt.l_ref", c.l_ref), ("cpt.l_tar", c.l_tar)]:
        _require(value >= 0, f"{key} must be >= 0, got {value}")
    _require(t.on_nonfinite in ("stop", "skip"),
             f"train.on_nonfinite must be 'stop' or 'skip', got {t.on_nonfinite!r}")
    _require(mesh.data == -1 or mesh.data >= 1, f"mesh.data must be -1 or >= 1, got {mesh.data}")

    _require(m.pattern != "" and set(m.pattern) <= set(MIXER_LETTERS),
             f"model.pattern must be a non-empty string over {sorted(MIXER_LETTERS)} "
             f"(A = attention, G = GatedDeltaNet), got {m.pattern!r}")
    _require(m.num_layers % len(m.pattern) == 0,
             f"model.pattern {m.pattern!r} (length {len(m.pattern)}) must tile "
             f"model.num_layers={m.num_layers}")
    _require(m.dtype in DTYPES, f"model.dtype must be one of {DTYPES}, got {m.dtype!r}")
    _require(m.param_dtype in DTYPES,
             f"model.param_dtype must be one of {DTYPES}, got {m.param_dtype!r}")
    _require(m.init_std > 0, f"model.init_std must be > 0, got {m.init_std}")
    _require(m.norm_eps > 0, f"model.norm_eps must be > 0, got {m.norm_eps}")
    if m.moe_experts:
        _require(m.moe_experts >= 1 and 1 <= m.moe_top_k <= m.moe_experts,
                 f"model.moe_top_k must lie in [1, model.moe_experts={m.moe_experts}], "
                 f"got {m.moe_top_k}")
        _require(m.moe_expert_dim >= 0 and m.moe_capacity_factor >= 0
                 and m.moe_aux_loss_coef >= 0,
                 f"model.moe_expert_dim, moe_capacity_factor and moe_aux_loss_coef must be >= 0, "
                 f"got {m.moe_expert_dim}, {m.moe_capacity_factor}, {m.moe_aux_loss_coef}")
    _require(m.moe_experts >= 0, f"model.moe_experts must be >= 0, got {m.moe_experts}")

    _require(a.kind in ATTENTION_KINDS,
             f"attention.kind must be one of {ATTENTION_KINDS}, got {a.kind!r}")
    allowed = POSITIONS_BY_KIND[a.kind]
    _require(a.position in allowed,
             f"attention.position={a.position!r} is not available for attention.kind="
             f"{a.kind!r} (allowed: {allowed})")
    _require(a.tau > 0, f"attention.tau must be > 0, got {a.tau}")
    if a.yarn_factor:
        _require(a.kind == "softmax" and a.position == "rope",
                 f"attention.yarn_factor needs attention.kind='softmax' with position='rope', "
                 f"got kind={a.kind!r}, position={a.position!r}")
        _require(a.yarn_factor >= 1 and a.yarn_original_length >= 1,
                 f"attention.yarn_factor must be 0 (off) or >= 1 with attention."
                 f"yarn_original_length >= 1, got {a.yarn_factor} and {a.yarn_original_length}")
    kinds = config.layer_kinds()
    fpa_variant_changed = (a.stack_form, a.key_level, a.query_level, a.content, a.dip_sum,
                           a.tau) != (False, True, False, True, False, 1.0)
    _require(a.kind == "fpa" or not fpa_variant_changed,
             f"attention FPA options (stack_form, key_level, query_level, content, dip_sum, tau) "
             f"only apply to attention.kind='fpa', got kind={a.kind!r}")
    if a.no_bias_layers:
        _require(a.kind == "fpa", f"attention.no_bias_layers only applies to attention.kind='fpa', "
                                  f"got kind={a.kind!r}")
        _require(a.content, "attention.no_bias_layers with attention.content=false leaves those "
                            "layers no attention logits (no bias, no q.k)")
        for index in a.no_bias_layers:
            _require(0 <= index < m.num_layers,
                     f"attention.no_bias_layers: layer {index} out of range [0, {m.num_layers})")
            _require(kinds[index] == "attention",
                     f"attention.no_bias_layers: layer {index} is a {kinds[index]} layer, "
                     f"not an attention layer (pattern {m.pattern!r})")
    if "gdn" in kinds:
        num_v_heads = g.num_v_heads or g.num_heads
        _require(num_v_heads % g.num_heads == 0,
                 f"gdn.num_v_heads={num_v_heads} must be a multiple of gdn.num_heads={g.num_heads}")
    else:
        _require(o.alpha_lr_scale == 1.0 and not o.freeze_gdn_decay,
                 "optim.alpha_lr_scale / optim.freeze_gdn_decay need GatedDeltaNet layers "
                 f"(model.pattern={m.pattern!r} has none)")

    _require(d.source != "", "data.source must not be empty")
    _require(d.shuffle in ("global", "window"),
             f"data.shuffle must be 'global' or 'window', got {d.shuffle!r}")
    _require(d.batch_size % t.grad_accum == 0,
             f"data.batch_size={d.batch_size} must be divisible by train.grad_accum="
             f"{t.grad_accum} (each micro-batch holds batch_size / grad_accum rows)")
    _require(0.0 < d.heldout_fraction < 1.0,
             f"data.heldout_fraction must be in (0, 1), got {d.heldout_fraction}")

    _require(o.name in ("adamw", "muon", "sgd"),
             f"optim.name must be adamw, muon or sgd, got {o.name!r}")
    _require(o.schedule in ("cosine", "constant"),
             f"optim.schedule must be cosine or constant, got {o.schedule!r}")
    _require(o.lr > 0, f"optim.lr must be > 0, got {o.lr}")
    _require(o.alpha_lr_scale > 0, f"optim.alpha_lr_scale must be > 0, got {o.alpha_lr_scale}")
    _require(0 <= o.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    _require(0 <= o.b1 < 1 and 0 <= o.b2 < 1 and 0 <= o.momentum < 1,
             "optim.b1, optim.b2 and optim.momentum must be in [0, 1)")
    _require(o.schedule == "constant" or o.warmup_steps < t.steps,
             f"optim.warmup_steps={o.warmup_steps} must be < train.steps={t.steps} "
             "for the cosine schedule; lower optim.warmup_steps (0: no warm-up) or use "
             "optim.schedule=constant")

    if mesh.context > 1:
        validate_context_parallel(config)

    _require(c.k > 0, f"cpt.k must be > 0, got {c.k}")
    _require(c.mode in ("matrix", "row"), f"cpt.mode must be matrix or row, got {c.mode!r}")
    _require(c.positions in CPT_POSITIONS,
             f"cpt.positions must be one of {CPT_POSITIONS}, got {c.positions!r}")
    _require(c.reference_step >= 0 and c.rope_base >= 0,
             f"cpt.reference_step and cpt.rope_base must be >= 0, got {c.reference_step} and "
             f"{c.rope_base}")
    validate_implementations(config)


def validate_context_parallel(config: Config) -> None:
    """mesh.context > 1: the sequence splits evenly and every mixer has a context-parallel op."""
    context, a = config.mesh.context, config.attention
    _require(config.data.seq_len % context == 0,
             f"data.seq_len={config.data.seq_len} must be divisible by mesh.context={context} "
             f"(each device holds seq_len / context tokens)")
    if "attention" not in config.layer_kinds():
        return
    _require(a.kind in CONTEXT_PARALLEL_KINDS,
             f"mesh.context={context} supports attention.kind in {CONTEXT_PARALLEL_KINDS} "
             f"(ring attention), got {a.kind!r}")
    _require(not a.dip_sum, f"mesh.context={context} does not support attention.dip_sum "
                            f"(a dense-only op)")
    _require(a.implementation is None,
             f"attention.implementation={a.implementation!r} must be unset with "
             f"mesh.context={context} (ring attention has a single XLA path)")


def validate_implementations(config: Config) -> None:
    """Each layer's `implementation` must be registered for the op that layer calls."""
    from fpa_jax import REGISTRIES as ATTENTION_REGISTRIES
    from gdn_jax import REGISTRIES as GDN_REGISTRIES
    from train.core.model import build_mixer

    registries = {**ATTENTION_REGISTRIES, **GDN_REGISTRIES}
    for index, kind in enumerate(config.layer_kinds()):
        mixer = build_mixer(config, index, name=None)
        try:
            registries[mixer.op_name].check_name(mixer.implementation)
        except ValueError as error:
            section = "gdn" if kind == "gdn" else "attention"
            what = "" if kind == "gdn" else f" with attention.kind={config.attention.kind!r}"
            raise ConfigError(f"{section}.implementation={mixer.implementation!r}{what} "
                              f"(layer {index}): {error}") from None


def validate_for_devices(config: Config, device_count: int) -> tuple[int, ...]:
    """(data, fsdp, tensor) mesh sizes for `device_count` devices, with a fourth, context, when
    mesh.context > 1 (train.core.sharding.make_mesh takes either); or ConfigError."""
    mesh = config.mesh
    model_parallel = mesh.fsdp * mesh.tensor * mesh.context
    _require(device_count % model_parallel == 0,
             f"mesh.fsdp * mesh.tensor * mesh.context = {model_parallel} does not divide the "
             f"{device_count} devices")
    data = device_count // model_parallel if mesh.data == -1 else mesh.data
    _require(data * model_parallel == device_count,
             f"mesh data={data} x fsdp={mesh.fsdp} x tensor={mesh.tensor} x context="
             f"{mesh.context} = {data * model_parallel} devices, but {device_count} are available")
    batch_shards = data * mesh.fsdp
    _require(config.data.batch_size % batch_shards == 0,
             f"data.batch_size={config.data.batch_size} must be divisible by "
             f"mesh.data * mesh.fsdp = {batch_shards}")
    micro_batch = config.data.batch_size // config.train.grad_accum
    _require(micro_batch % batch_shards == 0,
             f"the micro-batch data.batch_size / train.grad_accum = {micro_batch} must be "
             f"divisible by mesh.data * mesh.fsdp = {batch_shards}")
    # checkify cannot trace the mixers' shard_map (jax 0.11: "context mesh ... should match
    # the aval mesh"), which every mesh of more than one device uses
    _require(not config.train.check_ranges or device_count == 1,
             f"train.check_ranges=true runs on one device only, got {device_count} devices "
             f"(the checked step cannot trace the mixers' shard_map)")
    return (data, mesh.fsdp, mesh.tensor) + ((mesh.context,) if mesh.context > 1 else ())
