"""YAML presets + dotted key=value overrides -> a validated Config (train/core/config.py).

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

from train.core.config import Config, ConfigError, OptimConfig, TrainConfig
from train.core.validation import validate

BASE_KEY = "base"
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


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
