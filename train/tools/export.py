"""Checkpoint export in flash-linear-attention's (fla) Hugging Face layout, and its inverse.

    out_dir/model.safetensors   fla tensor names (train/tools/export_layout.py), float32 or bfloat16
    out_dir/config.json         fla config: model_type gated_deltanet | forgetting_transformer |
                                transformer, or fpa_transformer (this project's own, for FPA);
                                `dtype` (transformers' name for the deprecated `torch_dtype`),
                                and the tokenizer's special-token ids (export_run only)
    out_dir/generation_config.json   those token ids (export_run only)
    out_dir/README.md           how to load it; the FPA-specific tensors
    out_dir/tokenizer/          the run's tokenizer (export_run only)

Formats: "fla" (the above) and, for FPA models, "fpa-torch": the same tensors and config plus
`architectures` / `auto_map` in config.json and a PyTorch model for transformers' remote code,
out_dir/configuration_fpa.py and out_dir/modeling_fpa.py (copies of train/hf_fpa/), so that
`AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)` runs it without this
project. It refuses Gated DeltaNet layers and MoE FFNs (the PyTorch file has neither).

export_run refuses an --out that is a file, or a non-empty directory (a previous export or the
user's files) unless force=True; then it replaces the export's own files and keeps the rest.
The tokenizers of this project (train/data/tokenizer.py) define one special token, end of text
(eos_token_id); there is no BOS and no padding token, so bos_token_id / pad_token_id are left out.

Mapping of one parameter (flax -> torch), by kind:
    linear     kernel [in, out]                 -> weight [out, in]            (transpose)
    heads_in   kernel [D, H, Dh]                -> weight [H*Dh, D]            (head-major rows)
    heads_out  kernel [H, Dh, D]                -> weight [D, H*Dh]
    conv       depthwise kernel [W, C]          -> Conv1d weight [C, 1, W]     (tap order kept)
    same       embeddings [V, D], scales [D], per-head vectors [H]            (unchanged)
A mixer's names are its kind's `MixerSpec.export_names` (train/core/mixers.py), and the model
type and config.json entries, and what they refuse, are the `MixerSpec.export` of the kind of
the attention layers (of gdn without attention layers); the flax
GatedDeltaNet's z_proj is fla's g_proj (the output gate). Every parameter must be mapped: an
unknown or unmapped leaf raises, never a silent drop. `import_params` inverts the mapping
exactly, so export -> import is bit-identical (for bfloat16: to the bf16-rounded params).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import linen as nn
from flax import traverse_util

from train.checkpoint.run_files import TOKENIZER_DIRNAME
from train.core.config import Config
from train.core.mixers import GDN, MIXERS, MixerExport, layer_kinds
from train.core.model import LanguageModel, resolve_vocab_size
from train.core.presets import config_from_dict
from train.core.runs import load_run, restore_run_state
from train.core.session import build_session
from train.tools.safetensors_file import read_safetensors, write_safetensors

FORMATS = ("fla", "fpa-torch")
EXPORT_DTYPES = {"float32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16),
                 "bfloat16": np.dtype(ml_dtypes.bfloat16)}
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
README_FILE = "README.md"
JAX_CONFIG_KEY = "fpa_gdn_jax_config"   # the model's part of the training config, for re-import
HF_FPA_DIR = Path(__file__).resolve().parents[1] / "hf_fpa"
FPA_TORCH_FILES = ("configuration_fpa.py", "modeling_fpa.py")   # in HF_FPA_DIR, copied as is
FPA_TORCH_AUTO_MAP = {"AutoConfig": "configuration_fpa.FPAConfig",
                      "AutoModelForCausalLM": "modeling_fpa.FPAForCausalLM"}

# flax leaf path below a layer (BLOCK_NAMES) or the model (MODEL_NAMES) -> (fla name, kind)
BLOCK_NAMES = {
    ("mixer_norm", "scale"): ("attn_norm.weight", "same"),
    ("mlp_norm", "scale"): ("mlp_norm.weight", "same"),
    ("mlp", "gate", "kernel"): ("mlp.gate_proj.weight", "linear"),
    ("mlp", "up", "kernel"): ("mlp.up_proj.weight", "linear"),
    ("mlp", "down", "kernel"): ("mlp.down_proj.weight", "linear"),
}
MODEL_NAMES = {
    ("embed", "embedding"): ("model.embeddings.weight", "same"),
    ("final_norm", "scale"): ("model.norm.weight", "same"),
    ("lm_head", "kernel"): ("lm_head.weight", "linear"),
}


class ExportError(ValueError):
    """The model or the request cannot be exported in the asked layout."""


@dataclasses.dataclass(frozen=True)
class Entry:
    flax_path: tuple[str, ...]
    name: str
    kind: str


def to_torch(kind: str, array: np.ndarray) -> np.ndarray:
    """One flax parameter -> its torch layout (see the module docstring)."""
    if kind == "same":
        return array
    if kind == "linear":
        return array.T
    if kind == "heads_in":
        return array.reshape(array.shape[0], -1).T
    if kind == "heads_out":
        return array.reshape(-1, array.shape[-1]).T
    if kind == "conv":
        return array.T[:, None, :]
    raise ValueError(f"kind: unknown {kind!r}")


def from_torch(kind: str, tensor: np.ndarray, flax_shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of `to_torch`: a torch-layout tensor -> the flax parameter of `flax_shape`."""
    if kind == "conv":
        tensor = tensor[:, 0, :]
    result = tensor if kind == "same" else tensor.T.reshape(flax_shape)
    if result.shape != tuple(flax_shape):
        raise ValueError(f"from_torch: {kind} tensor of shape {tensor.shape} does not give flax "
                         f"shape {tuple(flax_shape)}")
    return result


def plan(config: Config, params: Any) -> list[Entry]:
    """Every flax parameter leaf of `params` (the LanguageModel's params) with its fla name."""
    flat = traverse_util.flatten_dict(params)
    kinds = layer_kinds(config)
    entries = []
    for path in flat:
        if path in MODEL_NAMES:
            name, kind = MODEL_NAMES[path]
            entries.append(Entry(path, name, kind))
            continue
        layer, rest = path[0], path[1:]
        if not layer.startswith("layers_") or not layer[len("layers_"):].isdigit():
            raise ExportError(f"params: no export name for parameter {'/'.join(path)}")
        index = int(layer[len("layers_"):])
        prefix = f"model.layers.{index}."
        if rest in BLOCK_NAMES:
            name, kind = BLOCK_NAMES[rest]
        elif rest[:1] == ("mixer",):
            table = MIXERS[kinds[index]].export_names
            if rest[1:] not in table:
                raise ExportError(f"params: no export name for parameter {'/'.join(path)}")
            suffix, kind = table[rest[1:]]
            name = "attn." + suffix
        else:
            raise ExportError(f"params: no export name for parameter {'/'.join(path)}")
        entries.append(Entry(path, prefix + name, kind))
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ExportError(f"params: two parameters map to one name in {sorted(names)}")
    return entries


# ----------------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------------


def _common_config(config: Config, vocab_size: int) -> dict[str, Any]:
    m = config.model
    return {"hidden_size": m.d_model, "num_hidden_layers": m.num_layers,
            "intermediate_size": config.mlp_dim(), "hidden_ratio": None, "hidden_act": "swish",
            "norm_eps": m.norm_eps, "vocab_size": vocab_size,
            "tie_word_embeddings": m.tie_embeddings,
            "max_position_embeddings": config.data.seq_len, "initializer_range": m.init_std,
            "dtype": None}


def _export(kind: str) -> MixerExport | None:
    """The kind's MixerExport; None for a kind without one (or without a spec)."""
    spec = MIXERS.get(kind)
    return spec.export if spec is not None else None


def fla_config(config: Config, vocab_size: int) -> dict[str, Any]:
    """config.json contents in fla's layout (or this project's fpa_transformer for FPA): the
    `MixerExport` of the kind of its attention layers, or of gdn where it has none."""
    has_attention = "attention" in config.layer_sections()
    kind = config.attention.kind if has_attention else GDN
    base = _common_config(config, vocab_size)
    export = _export(kind)
    if export is None:
        raise ExportError(f"attention.kind={kind!r}: flash-linear-attention has no model with "
                          f"this attention; exportable: gdn, fox, softmax (rope), fpa")
    refusal = export.refusal(config)
    if refusal is not None:
        raise ExportError(refusal)
    return export.config(config, base)


def fpa_torch_config(config: Config, vocab_size: int) -> dict[str, Any]:
    """config.json of the fpa-torch format: the FPA model's fla_config without `layer_types`,
    plus `architectures` and `auto_map` (transformers' remote code: train/hf_fpa/). Refuses
    what the PyTorch file does not implement (kinds whose `MixerExport.fpa_torch` is False)."""
    def runs(kind: str) -> bool:
        export = _export(kind)
        return export is not None and export.fpa_torch

    if not runs(config.attention.kind):
        raise ExportError(f"attention.kind={config.attention.kind!r}: format 'fpa-torch' is for "
                          f"FPA models; use format 'fla'")
    missing = [kind for kind in layer_kinds(config) if not runs(kind)]
    if missing:
        raise ExportError(f"model.pattern={config.model.pattern!r}: format 'fpa-torch' has no "
                          f"{MIXERS[missing[0]].title} layer in its PyTorch model; use format "
                          f"'fla'")
    if config.model.moe_experts:
        raise ExportError(f"model.moe_experts={config.model.moe_experts}: format 'fpa-torch' has "
                          f"no mixture-of-experts FFN in its PyTorch model")
    fla = fla_config(config, vocab_size)
    del fla["layer_types"]      # all "fpa"; transformers 5 accepts only its own layer types there
    return {**fla, "architectures": ["FPAForCausalLM"], "auto_map": dict(FPA_TORCH_AUTO_MAP)}


def export_config(config: Config, vocab_size: int, format: str) -> dict[str, Any]:
    """config.json contents of `format` (FORMATS); raises ExportError for what it cannot hold."""
    if format == "fla":
        return fla_config(config, vocab_size)
    if format == "fpa-torch":
        return fpa_torch_config(config, vocab_size)
    raise ExportError(f"format: expected one of {list(FORMATS)}, got {format!r}")


# ----------------------------------------------------------------------------------------------
# Export / import
# ----------------------------------------------------------------------------------------------


README_TEXT = """# Exported checkpoint ({model_type})

Written by `python -m train export` from {source}.

- `model.safetensors`: weights ({dtype}), tensor names of flash-linear-attention's Hugging Face
  model classes (`fla.models`); `config.json`: its config (`model_type` = `{model_type}`).
  `{jax_key}` in config.json keeps the part of this project's training config that defines
  the model (model, mixer sections, trained context length), for re-import.
{body}
"""

FLA_BODY = """
## Loading with flash-linear-attention (PyTorch, GPU for the Triton kernels)

```python
import fla  # registers the fla model types with transformers
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("{out_dir}", dtype="auto").cuda()
# (transformers < 4.56: torch_dtype="auto")
```

Mapping from the JAX parameters: Linear weights are the transposed flax kernels
([in, out] -> [out, in]); multi-head kernels [D, H, Dh] become [H*Dh, D] (head-major rows) and
the output kernel [H, Dh, D] becomes [D, H*Dh]; the GatedDeltaNet depthwise conv kernels [W, C]
become Conv1d weights [C, 1, W]; the GatedDeltaNet output gate `z_proj` is fla's `g_proj`.
{tie_note}

The JAX model restarts positions and masks attention at document boundaries of packed
sequences; give fla one document per sequence (or its `cu_seqlens`) for the same logits.
Comparing float32 logits with the JAX model: fla's Triton kernels multiply float32 inputs in
TF32 unless `TRITON_F32_DEFAULT=ieee` is set before they compile; also set
`torch.backends.cuda.matmul.allow_tf32 = False` and run JAX under
`jax.default_matmul_precision("highest")`, as JAX uses TF32 on a GPU by default too (with TF32
on both sides the logits of small models differed by about 2e-3).
Status: re-import into JAX is tested bit-exact; fla's own model classes load these files and,
on the CPU with PyTorch stand-ins for fla's Triton kernels, give the JAX model's float32 logits
within 1e-5 (tests/benchmarks/test_verify_export_fla.py); benchmarks/verify_export_fla.py runs the same
comparison with fla's kernels on a GPU.
"""

FPA_BODY = """
## FPA (no other library implements it)

`model_type` `fpa_transformer` is this project's own: the shared parts (embeddings, norms, MLP,
q/k/v/o projections, Gated DeltaNet layers of a hybrid) use fla's names and layouts (see
`transformer` / `gated_deltanet` in fla), and each FPA layer `model.layers.{{i}}.attn` adds:

| tensor | shape | meaning |
|---|---|---|
| `delta_proj.weight`, `delta_proj.bias` | [H, D], [H] | walk step delta = x W^T + b |
| `field_proj.weight`, `field_proj.bias` | [H, D], [H] | field g (absent with `stack_form`) |
| `level_proj.weight`, `level_proj.bias` | [H, D], [H] | level h (absent with `stack_form` |
|  |  | or `key_level: false`) |
| `rho` | [H] | bias scale beta = softplus(rho) |

With W = cumsum(delta), phi = W + g, psi = W + h, the attention logit of query t and key s is
q_t.k_s / sqrt(head_dim) + beta * min(0, min_{{s<u<=t}} phi_u - psi_s) (no RoPE); q/k are
absent with `content: false`; layers in `fpa.no_bias_layers` are plain causal softmax attention
without positions (q/k/v/o only). `layer_types` says which layers are Gated DeltaNet (`gdn`)
(format fpa-torch: FPA layers only, no `layer_types`).
{tie_note}

{loading}"""

FPA_FLA_LOADING = """This export has no PyTorch model class (`python -m train export RUN --format fpa-torch`
adds one for FPA models without Gated DeltaNet layers); load the tensors with
`safetensors.torch.load_file`, or back into JAX with `train.tools.export.load_export("{out_dir}")`.
"""

FPA_TORCH_LOADING = """## Loading with PyTorch (transformers' remote code, CPU or GPU)

`configuration_fpa.py` and `modeling_fpa.py` here define the model in dense PyTorch (they import
only torch and transformers); `auto_map` in config.json points transformers at them:

```python
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("{out_dir}", trust_remote_code=True,
                                             dtype=torch.float32)   # transformers < 4.56: torch_dtype
logits = model(input_ids).logits          # float32 [B, T, vocab_size]
```

The tensor names above are the parameter paths of `FPAForCausalLM` in modeling_fpa.py. In
float32 its logits match the JAX model's (relative L2 error within 1e-5 in this project's
tests/train/tools/test_export_fpa_torch.py). Give one document per row; `attention_mask` may mark
left or right padding. The attention is dense (memory O(T^2) per head), `generate()` re-runs
the whole sequence at each step (no KV cache), and the gradient of the range minimum is the
hard minimum's, not the straight-through soft minimum (`fpa.tau`) of the JAX training.
Re-import into JAX: `train.tools.export.load_export("{out_dir}")`.
"""


def _numpy_params(params: Any) -> dict[tuple[str, ...], np.ndarray]:
    return {path: np.asarray(jax.device_get(leaf))
            for path, leaf in traverse_util.flatten_dict(params).items()}


SPECIAL_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    """{eos_token_id: ...}, and bos/pad where `tokenizer` defines them (`bos_id`, `eos_id`,
    `pad_id`; this project's tokenizers define end of text only)."""
    ids = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = getattr(tokenizer, key.replace("_token", ""), None)
        if value is not None:
            ids[key] = int(value)
    return ids


def _token_ids_note(token_ids: dict[str, int]) -> str:
    """README lines on the special tokens written to config.json / generation_config.json."""
    if not token_ids:
        return ""
    ids = ", ".join(f"`{key}` {value}" for key, value in token_ids.items())
    note = f"\nSpecial tokens (config.json and `{GENERATION_CONFIG_FILE}`): {ids}."
    absent = {"bos_token_id": "no BOS token", "pad_token_id": "no padding token"}
    missing = [key for key in absent if key not in token_ids]
    if missing:
        note += (f" The tokenizer defines {' and '.join(absent[key] for key in missing)}, so "
                 f"{' and '.join(f'`{key}`' for key in missing)} are left out.")
    return note + "\n"


def export_params(params: Any, config: Config, vocab_size: int, out_dir: str | Path, *,
                  format: str = "fla", dtype: str = "float32", source: str = "a JAX checkpoint",
                  token_ids: dict[str, int] | None = None) -> Path:
    """Write model.safetensors, config.json and README.md for `params` into `out_dir`
    (replacing files of those names), and FPA_TORCH_FILES for format "fpa-torch".
    token_ids: {eos_token_id: ...} (SPECIAL_TOKEN_KEYS) for config.json, also written as
    generation_config.json; None or {}: neither."""
    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"dtype: expected one of {sorted(EXPORT_DTYPES)}, got {dtype!r}")
    target = EXPORT_DTYPES[dtype]
    fla = export_config(config, vocab_size, format)
    flat = _numpy_params(params)
    tensors = {}
    for entry in sorted(plan(config, params), key=lambda e: e.name):
        array = flat[entry.flax_path]
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise ExportError(f"params: {'/'.join(entry.flax_path)} has the non-float dtype "
                              f"{array.dtype}")
        tensors[entry.name] = np.ascontiguousarray(to_torch(entry.kind, array).astype(target))
    fla["dtype"] = "bfloat16" if target != np.float32 else "float32"
    token_ids = dict(token_ids or {})
    unknown = sorted(set(token_ids) - set(SPECIAL_TOKEN_KEYS))
    if unknown:
        raise ExportError(f"token_ids: unknown keys {unknown}; expected some of "
                          f"{list(SPECIAL_TOKEN_KEYS)}")
    fla.update(token_ids)
    fla[JAX_CONFIG_KEY] = {"config": model_config_dict(config), "vocab_size": vocab_size}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_safetensors(out_dir / WEIGHTS_FILE, tensors, metadata={"format": "pt"})
    (out_dir / CONFIG_FILE).write_text(json.dumps(fla, indent=1) + "\n")
    if token_ids:
        (out_dir / GENERATION_CONFIG_FILE).write_text(json.dumps(token_ids, indent=1) + "\n")
    if format == "fpa-torch":
        for name in FPA_TORCH_FILES:
            shutil.copyfile(HF_FPA_DIR / name, out_dir / name)
    model_type = fla["model_type"]
    tie_note = ("`lm_head.weight` is not stored: the output head is tied to the embeddings "
                "(`tie_word_embeddings: true`)." if config.model.tie_embeddings else "")
    loading = FPA_TORCH_LOADING if format == "fpa-torch" else FPA_FLA_LOADING
    body = (FPA_BODY if model_type == "fpa_transformer" else FLA_BODY).format(
        out_dir=out_dir, tie_note=tie_note, loading=loading.format(out_dir=out_dir))
    (out_dir / README_FILE).write_text(README_TEXT.format(
        model_type=model_type, source=source, dtype=fla["dtype"], jax_key=JAX_CONFIG_KEY,
        body=body) + _token_ids_note(token_ids))
    return out_dir


def model_config_dict(config: Config) -> dict[str, Any]:
    """The parts of the training config that define the model, as embedded in config.json
    for re-import: the model section, the sections of the mixer kinds its layers use and the
    trained context length (no data source, optimizer, mesh or schedule)."""
    full = config.to_dict()
    kinds = set(config.layer_sections())
    embedded = {"name": full["name"], "model": full["model"]}
    embedded.update({kind: full[kind] for kind in ("attention", "gdn") if kind in kinds})
    embedded["data"] = {"seq_len": config.data.seq_len}
    return embedded


def import_params(out_dir: str | Path, config: Config, template: Any) -> Any:
    """The params of an export as numpy arrays in the export's dtype, in the tree of `template`
    (the model's params or their shapes, e.g. `abstract_params`); inverse of `export_params`."""
    tensors, _ = read_safetensors(Path(out_dir) / WEIGHTS_FILE)
    entries = plan(config, template)
    shapes = {path: tuple(leaf.shape)
              for path, leaf in traverse_util.flatten_dict(template).items()}
    expected = {e.name for e in entries}
    if set(tensors) != expected:
        raise ValueError(f"{out_dir}: tensors differ from the model's; missing "
                         f"{sorted(expected - set(tensors))}, "
                         f"unexpected {sorted(set(tensors) - expected)}")
    flat = {e.flax_path: from_torch(e.kind, tensors[e.name], shapes[e.flax_path]) for e in entries}
    return traverse_util.unflatten_dict(flat)


def load_export(out_dir: str | Path) -> tuple[Config, int, Any]:
    """(config, vocab_size, params) of an export, from its config.json and weights."""
    saved = json.loads((Path(out_dir) / CONFIG_FILE).read_text())[JAX_CONFIG_KEY]
    config, vocab_size = config_from_dict(saved["config"]), saved["vocab_size"]
    return config, vocab_size, import_params(out_dir, config, abstract_params(config, vocab_size))


def abstract_params(config: Config, vocab_size: int) -> Any:
    """The LanguageModel's unboxed params as jax.ShapeDtypeStruct leaves (nothing computed)."""

    dummy = jnp.zeros((1, 8), jnp.int32)
    boxed = jax.eval_shape(lambda: LanguageModel(config, vocab_size).init(
        jax.random.PRNGKey(0), dummy, jnp.ones_like(dummy))["params"])
    return nn.meta.unbox(boxed)


def _check_out_dir(out_dir: Path, force: bool) -> None:
    """--out must be a new or empty directory (or, with force, any directory)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"--out: {out_dir} is a file, expected a directory (a new or empty one)")
    for parent in out_dir.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ExportError(f"--out: {parent} is a file, so {out_dir} cannot be created")
            break
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(f"--out: {out_dir} is not empty (a previous export or other files); "
                          f"name a new or empty directory, or pass --force to overwrite the "
                          f"export's files there (other files are kept)")


EXPORT_ENTRIES = (WEIGHTS_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, README_FILE,
                  *FPA_TORCH_FILES)


def export_run(run_dir: str | Path, out_dir: str | Path, *, format: str = "fla",
               dtype: str = "float32", step: int | None = None,
               force: bool = False) -> tuple[Path, int]:
    """Export a run's newest (or `step`) checkpoint; returns (out_dir, step). A non-empty
    `out_dir` is refused unless `force` (then the export's own files and tokenizer/ in it are
    replaced, anything else is kept)."""
    if format not in FORMATS:
        raise ExportError(f"--format: expected one of {list(FORMATS)}, got {format!r}")
    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"--dtype: expected one of {sorted(EXPORT_DTYPES)}, got {dtype!r}")
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, force)

    config, tokenizer = load_run(run_dir)
    export_config(config, resolve_vocab_size(config, tokenizer.vocab_size), format)  # fail early
    session = build_session(config, tokenizer.vocab_size)
    restored = restore_run_state(run_dir, session, step)
    vocab_size = resolve_vocab_size(config, tokenizer.vocab_size)
    if out_dir.is_dir():        # force: the previous export's files go, the user's stay
        for name in EXPORT_ENTRIES:
            if (out_dir / name).is_file():
                (out_dir / name).unlink()
        if (out_dir / TOKENIZER_DIRNAME).is_dir():
            shutil.rmtree(out_dir / TOKENIZER_DIRNAME)
    path = export_params(restored.state["params"], config, vocab_size, out_dir, format=format,
                         dtype=dtype, source=f"run {run_dir}, step {restored.step}",
                         token_ids=special_token_ids(tokenizer))
    tokenizer_dir = Path(run_dir) / TOKENIZER_DIRNAME
    if tokenizer_dir.is_dir():
        shutil.copytree(tokenizer_dir, path / TOKENIZER_DIRNAME)
        with open(path / README_FILE, "a") as readme:
            readme.write(f"\n`{TOKENIZER_DIRNAME}/` is the run's tokenizer in this project's "
                         f"format (`train.data.tokenizer.load_tokenizer`); Hugging Face's "
                         f"`AutoTokenizer` cannot load it.\n")
    return path, restored.step

