"""Load this project's exports into flash-linear-attention's (fla) model classes and compare logits.

    python benchmarks/verify_export_fla.py --out DIR [--models fox,softmax,gdn,gdn_softmax_hybrid]
        [--sizes 2x256x2,12x4096x1] [--budget 500] [--jobs 4] [--no-tf32-check]
        [--torch-device cuda|cpu] [--fla-autotune reduced|full] [--wheels .whl,.whlhf]
        [--work /tmp/verify_export_fla]

For each model family (FoX; softmax + RoPE with an untied head; Gated DeltaNet with grouped
value heads; GDN + softmax hybrid) and each size LAYERSxLENGTHxBATCH, a small LanguageModel
(d_model 256, 4 attention heads of 64, GDN 2 q/k heads of 64 and 4 value heads, vocab 512) with
its own initialisation, every parameter moved by 0.05 N(0, 1) (so that no norm scale sits at 1
and no bias at 0), is exported with `train.tools.export.export_params` (float32) and the logits on
the same random tokens (one document per row) are compared (relative L2 over all logits):

    fp32       fla float32 vs JAX float32, both in true float32: JAX under
               jax.default_matmul_precision("highest"); PyTorch with TF32 off
               (torch.backends.cuda.matmul.allow_tf32 = cudnn.allow_tf32 = False,
               set_float32_matmul_precision("highest")) and TRITON_F32_DEFAULT=ieee, so that
               fla's Triton kernels' tl.dot run IEEE float32 instead of their TF32 default (fla's
               own tests do the same). The fla softmax layers call flash_attn, absent from the
               image: a stand-in runs PyTorch's SDPA (math backend in float32). fla's gated
               delta rule names TF32 for its intra-chunk triangular solve, which the variable
               does not reach: force_ieee_in_fla_kernels sets it to IEEE. Target: 1e-5.
    fp32 tail  the same over the last eighth of the positions (error growing with length)
    fla-f64, JAX-f64   each side's float32 logits vs a float64 numpy forward of the export in
               fla's conventions (f64_logits). When both sides are about as far from it as from
               each other, their difference is float32 rounding, not a conversion mismatch
               (at 12 layers and 4096 tokens that floor is near 1e-5 for these random models);
               the verdict then says "fp32 ok at float32 rounding".
    TF32 dflt  both sides at their defaults (JAX's default precision, TF32 on a GPU; fla's
               Triton TF32 dots): the ~2e-3 of the first check, first size only
    (JSON only) fp32_softplus, fla_softplus_vs_f64: fla's GDN families once more in float32
               with an exact softplus in the gate (exact_softplus_in_fla_gdn_gate; fla's own is
               PTX ex2/lg2.approx), telling fla's fast math from a conversion error
    bf16       fla in bfloat16 vs JAX float32, beside the frameworks' own bfloat16 error on
               the same model: fla bf16 vs fla fp32, and JAX bf16 (model.dtype=bfloat16,
               float32 params) vs JAX fp32; bf16 passes within 2x the larger of the two.

Processes: this one orchestrates (numpy only, no JAX or PyTorch). Per family, in `--jobs`
parallel chains: a JAX process exports every size and saves the float32 logits; then side by
side a JAX process for the bf16 / default-precision logits, a PyTorch process (true float32
and bf16), the float64 oracle, with the TF32 check a PyTorch process at fla's defaults and, for
the GDN families on a GPU (--softplus-check), one with the exact softplus.
Every process writes its logits and a status JSON as it goes, so a crash, a traceback or the
time budget stops one step of one family and the table shows the rest. `--budget` seconds
after the start every process still running is stopped; the table is printed last and written
with every number to DIR/verify_export_fla.md and DIR/verify_export_fla.json (WORK keeps the
exports, logits and logs). Exit status 0 only when every family and size ran and passed.

PyTorch side: fla needs transformers (>= 5.6.2, < 6) and einops. `--wheels` installs folders of
wheels (--no-deps) into /tmp/hf_site, put first on the PyTorch processes' path;
benchmarks/gpu/verify_export.sh installs .whl and .whlhf itself. fla autotunes most Triton
kernels over many configs, each compiled; `--fla-autotune reduced` (default) keeps one config
per tile setting (limit_triton_autotuning). `--torch-device cpu` (a check without a GPU) runs
fla's model classes on the CPU with PyTorch stand-ins for fla's Triton kernels (fla's own
reference functions where fla has one: naive_forgetting_attn, naive_recurrent_gated_delta_rule,
rotary_embedding_ref); it checks the export's names, layouts and conventions against fla's
modules, not fla's kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

VOCAB = 512
BASE = ["model.d_model=256", "attention.num_heads=4", "attention.head_dim=64",
        "gdn.num_heads=2", "gdn.head_dim=64", f"model.vocab_size={VOCAB}",
        "model.vocab_multiple=1"]
MODELS = {
    "fox": ["attention.kind=fox"],
    "softmax": ["attention.kind=softmax", "attention.position=rope",
                "model.tie_embeddings=false"],
    "gdn": ["model.pattern=G", "gdn.num_v_heads=4"],
    "gdn_softmax_hybrid": ["model.pattern=GA", "attention.kind=softmax",
                           "attention.position=rope", "gdn.num_v_heads=4"],
}
DEFAULT_SIZES = "2x256x2,12x4096x1"
PERTURBATION = 0.05
FP32_TOLERANCE = 1e-5
BF16_FACTOR = 2.0          # bf16 passes within this factor of the frameworks' own bf16 error
TAIL = 8                   # "fp32 tail": the last 1/TAIL of the positions
FINISH_RESERVE = 15.0      # seconds kept after the last process for the table
LOG_TAIL_LINES = 25
DIAGNOSTIC_ROLES = ("torch_tf32", "torch_softplus")
F64_THREADS = {name: "4" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                      "MKL_NUM_THREADS")}   # numpy's BLAS beside the rest


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    """"2x256x2,12x4096" -> [(layers, length, batch)], batch 1 where left out."""
    sizes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        try:
            numbers = [int(p) for p in parts]
        except ValueError:
            numbers = []
        if len(numbers) not in (2, 3) or min(numbers) < 1:
            raise argparse.ArgumentTypeError(
                f"--sizes: expected LAYERSxLENGTH[xBATCH] items (e.g. 2x256x2,12x4096), "
                f"got {item!r}")
        sizes.append((numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 1))
    return sizes


def size_name(size: tuple[int, int, int]) -> str:
    layers, length, batch = size
    return f"L{layers}_T{length}_B{batch}"


def parse_models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--models: unknown {unknown}; expected some of {list(MODELS)}")
    return names


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:600]


# ----------------------------------------------------------------------------------------------
# JAX side (a subprocess): export and logits
# ----------------------------------------------------------------------------------------------


def family_config(name: str, size, extra=()):
    from train.core.presets import load_config

    layers, length, _ = size
    return load_config(None, BASE + MODELS[name] + [f"model.num_layers={layers}",
                                                    f"data.seq_len={length}", *extra])


def jax_side(work: Path, name: str, sizes, stage: str, tf32_check: bool) -> int:
    """stage "export": the export and the float32 (highest) logits of every size;
    stage "extras": the bf16 logits and (first size, tf32_check) the default-precision ones."""
    import jax

    from train.core.model import LanguageModel
    from train.tools import export

    status_file = work / name / f"jax_{stage}.json"
    status = {"platform": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
              "sizes": {}}
    write_json(status_file, status)
    failed = False
    for index, size in enumerate(sizes):
        folder = work / name / size_name(size)
        folder.mkdir(parents=True, exist_ok=True)
        row = status["sizes"].setdefault(size_name(size), {})
        _, length, batch = size
        ones = np.ones((batch, length), np.int32)
        try:
            if stage == "export":
                start = time.time()
                tokens = np.random.default_rng(0).integers(0, VOCAB, (batch, length))
                tokens = tokens.astype(np.int32)
                config = family_config(name, size, ["model.dtype=float32"])
                model = LanguageModel(config, VOCAB)
                dummy = np.zeros((1, 8), np.int32)
                params = jax.jit(model.init)(jax.random.PRNGKey(1), dummy, np.ones_like(dummy))
                params = jax.tree.map(lambda p: p.unbox() if hasattr(p, "unbox") else p,
                                      params["params"], is_leaf=lambda p: hasattr(p, "unbox"))
                # The initialisation leaves some vectors at exactly 0/1 (norm scales, biases, the
                # forget kernel): move every leaf so a transposed or swapped tensor cannot hide.
                leaves, tree = jax.tree.flatten(params)
                rng = np.random.default_rng(2 + index)
                leaves = [np.asarray(x) + np.float32(PERTURBATION)
                          * rng.standard_normal(x.shape, np.float32) for x in leaves]
                params = jax.tree.unflatten(tree, leaves)
                export.export_params(params, config, VOCAB, folder)
                np.save(folder / "tokens.npy", tokens)
                with jax.default_matmul_precision("highest"):
                    logits = jax.jit(model.apply)({"params": params}, tokens, ones)
                    logits = np.asarray(logits, np.float32)
                np.save(folder / "jax_fp32.npy", logits)
                row["fp32_seconds"] = round(time.time() - start, 1)
                print(f"jax: {name} {size_name(size)} exported, float32 logits "
                      f"({row['fp32_seconds']} s)", flush=True)
            else:
                tokens = np.load(folder / "tokens.npy")
                _, _, params = export.load_export(folder)
                steps = [("bf16", ["model.dtype=bfloat16"])]
                if tf32_check and index == 0:
                    steps.append(("fp32_default", ["model.dtype=float32"]))
                for label, extra in steps:      # JAX's default matmul precision
                    start = time.time()
                    try:
                        model = LanguageModel(family_config(name, size, extra), VOCAB)
                        logits = jax.jit(model.apply)({"params": params}, tokens, ones)
                        np.save(folder / f"jax_{label}.npy", np.asarray(logits, np.float32))
                        row[f"{label}_seconds"] = round(time.time() - start, 1)
                        print(f"jax: {name} {size_name(size)} {label} logits "
                              f"({row[f'{label}_seconds']} s)", flush=True)
                    except Exception as error:
                        failed = True
                        row[f"{label}_error"] = error_text(error)
                        traceback.print_exc()
                    write_json(status_file, status)
        except Exception as error:
            failed = True
            row["error"] = error_text(error)
            traceback.print_exc()
        write_json(status_file, status)
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------
# PyTorch side (a subprocess): fla's AutoModelForCausalLM
# ----------------------------------------------------------------------------------------------


FLASH_ATTN_STAND_IN = '''"""Stand-in for flash_attn (verification only): causal SDPA.

float32 inputs run SDPA's math backend (plain matmuls and softmax, TF32 as the torch flags
say); other dtypes SDPA's default choice (flash attention for bf16 on a GPU)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def flash_attn_func(q, k, v, causal=True, window_size=(-1, -1), **kwargs):
    if not causal or tuple(window_size) != (-1, -1):
        raise NotImplementedError("stand-in: causal attention without a window only")
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))        # [B, H, T, D]
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scale = kwargs.get("softmax_scale")
    if q.dtype == torch.float32:
        with sdpa_kernel([SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return out.transpose(1, 2)


def flash_attn_varlen_func(*args, **kwargs):
    raise NotImplementedError("stand-in: no variable-length attention")
'''


def install_flash_attn_stand_in() -> bool:
    """Make `import flash_attn` work when the image lacks it; True when the stand-in is used."""
    try:
        import flash_attn  # noqa: F401
        return False
    except ImportError:
        folder = Path(f"/tmp/flash_attn_stand_in_{os.getpid()}/flash_attn")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text(FLASH_ATTN_STAND_IN)
        sys.path.insert(0, str(folder.parent))
        return True


def limit_triton_autotuning() -> None:
    """fla autotunes most kernels over num_warps x num_stages x tile sizes (48 configs for the
    global cumsum), each config compiled: minutes per process. Keep, per tile setting (the
    config's kwargs), the one with num_warps nearest 4 and num_stages nearest 2; should the
    reduced set fail on some input, that kernel goes back to its full list. Only which tiling
    runs changes, not what is computed."""
    from triton.runtime import autotuner

    def reduced(configs):
        best = {}
        for config in configs:
            key = json.dumps(config.kwargs, sort_keys=True, default=str)
            rank = (abs((config.num_warps or 4) - 4), abs((config.num_stages or 2) - 2))
            if key not in best or rank < best[key][0]:
                best[key] = (rank, config)
        return [config for _, config in best.values()]

    original_init, original_run = autotuner.Autotuner.__init__, autotuner.Autotuner.run

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.verify_full_configs = list(self.configs)
        self.configs = reduced(self.configs)

    def run(self, *args, **kwargs):
        try:
            return original_run(self, *args, **kwargs)
        except Exception:
            full = getattr(self, "verify_full_configs", None)
            if full is None or len(full) == len(self.configs):
                raise
            print(f"torch: autotune of {getattr(self, 'fn', self)} failed on the reduced "
                  f"configs; back to its {len(full)}", flush=True)
            self.configs = full
            self.cache.clear()
            return original_run(self, *args, **kwargs)

    autotuner.Autotuner.__init__ = init
    autotuner.Autotuner.run = run


def force_ieee_in_fla_kernels() -> dict:
    """TRITON_F32_DEFAULT=ieee sets the precision of the tl.dot calls that name none; fla's
    gated delta rule names one for its intra-chunk triangular solve, TF32 on TF32-capable GPUs
    (fla.ops.gated_delta_rule.chunk_fwd.SOLVE_TRIL_DOT_PRECISION, fla 0.6.0). Set it to IEEE
    before the kernel compiles; returns what was changed."""
    import triton.language as tl

    import fla.ops.gated_delta_rule.chunk_fwd as chunk_fwd

    changed = {}
    for name in ("SOLVE_TRIL_DOT_PRECISION",):
        old = getattr(chunk_fwd, name, None)
        value = getattr(old, "value", old)
        if old is not None and value != "ieee":
            setattr(chunk_fwd, name, tl.constexpr("ieee"))
            changed[f"fla.ops.gated_delta_rule.chunk_fwd.{name}"] = f"{value} -> ieee"
    return changed


EXACT_SOFTPLUS = '''"""softplus with libdevice's log1p and exp (verification only)."""
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice


@triton.jit
def softplus(x):
    return tl.where(x < 20.0, tldevice.log1p(tldevice.exp(x)), x)
'''


def exact_softplus_in_fla_gdn_gate() -> dict:
    """fla's gated delta rule computes its gate -exp(A_log) softplus(a + dt_bias) with a softplus
    of PTX ex2.approx / lg2.approx (fla.ops.utils.softplus on NVIDIA), whose absolute error of
    about 2^-22 in log2 is a relative 1e-5 of softplus values near 0.01. Diagnostic (torch mode
    "softplus"): swap in libdevice's log1p(exp(x)) before the kernels compile."""
    folder = Path(f"/tmp/fla_exact_softplus_{os.getpid()}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fla_exact_softplus.py").write_text(EXACT_SOFTPLUS)
    sys.path.insert(0, str(folder))
    import fla_exact_softplus

    import fla.ops.gated_delta_rule.fused_recurrent as fused_recurrent
    import fla.ops.gated_delta_rule.gate as gate

    changed = {}
    for module in (gate, fused_recurrent):
        if hasattr(module, "softplus"):
            module.softplus = fla_exact_softplus.softplus
            changed[f"{module.__name__}.softplus"] = "libdevice log1p(exp(x))"
    return changed


def install_cpu_reference_ops() -> None:
    """Run fla's model classes on the CPU: its Triton-only pieces replaced by PyTorch, fla's own
    reference functions where it has one, else the kernel's formula as read in fla 0.6.0's
    source (fused RMSNorm with residual, gated RMSNorm, SwiGLU, short convolution, the gated
    delta rule's in-kernel L2 norm / gate / sigmoid and its value head -> q/k head map
    i_hv // (HV / H))."""
    import torch
    import torch.nn.functional as F

    import fla.layers.forgetting_attn as fox_layer
    import fla.layers.gated_deltanet as gdn_layer
    import fla.modules.mlp as mlp
    import fla.modules.rotary.ops as rotary_ops
    from fla.modules import FusedRMSNormGated, RMSNorm
    from fla.ops.forgetting_attn.naive import naive_forgetting_attn
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    def rms_norm(self, x, residual=None, prenorm=False, residual_in_fp32=False):
        if residual is not None:
            x = x + residual
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        y = (y * self.weight.float()).to(x.dtype)
        return (y, x) if prenorm else y

    def gated_rms_norm(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        gate = g.float()
        y = y * (F.silu(gate) if self.activation in ("swish", "silu") else torch.sigmoid(gate))
        return y.to(x.dtype)

    def rotary(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
               chunk_indices=None):
        if cu_seqlens is not None or not isinstance(seqlen_offsets, int):
            raise NotImplementedError("cpu reference: one offset, no cu_seqlens")
        length = x.shape[1]
        cos = cos[seqlen_offsets:seqlen_offsets + length]
        sin = sin[seqlen_offsets:seqlen_offsets + length]
        return rotary_ops.rotary_embedding_ref(x, cos, sin, interleaved=interleaved)

    def forgetting_attn(q, k, v, g, scale=None, window_size=None, cu_seqlens=None):
        if cu_seqlens is not None:
            raise NotImplementedError("cpu reference: no cu_seqlens")
        return naive_forgetting_attn(q, k, v, g, scale, window_size).to(q.dtype)

    def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                         output_final_state=False, use_qk_l2norm_in_kernel=False,
                         use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                         state_v_first=False, cu_seqlens=None, use_gate_in_kernel=False,
                         A_log=None, dt_bias=None, **_):
        if cu_seqlens is not None or initial_state is not None:
            raise NotImplementedError("cpu reference: no cu_seqlens, no initial state")
        if use_qk_l2norm_in_kernel:      # l2norm_fwd: x / sqrt(sum x^2 + 1e-6)
            q, k = (x.float() * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) + 1e-6)
                    for x in (q, k))
        if use_gate_in_kernel:           # -exp(A_log) * softplus(g + dt_bias)
            g = -A_log.float().exp() * F.softplus(g.float() + dt_bias.float())
        if use_beta_sigmoid_in_kernel:
            beta = beta.float().sigmoid()
        if allow_neg_eigval:
            beta = beta * 2
        group = v.shape[2] // q.shape[2]         # value head j reads q/k head j // group
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
        o, state = naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=scale,
                                                    output_final_state=output_final_state)
        return o.to(v.dtype), state

    def short_conv(x, weight, bias=None, activation=None, **_):
        width = weight.shape[-1]
        y = F.conv1d(F.pad(x.transpose(1, 2), (width - 1, 0)), weight.unsqueeze(1), bias,
                     groups=weight.shape[0]).transpose(1, 2)
        return (F.silu(y) if activation in ("silu", "swish") else y), None

    RMSNorm.forward = rms_norm
    FusedRMSNormGated.forward = gated_rms_norm
    rotary_ops.rotary_embedding = rotary
    fox_layer.parallel_forgetting_attn = forgetting_attn
    gdn_layer.chunk_gated_delta_rule = gated_delta_rule
    gdn_layer.fused_recurrent_gated_delta_rule = gated_delta_rule
    gdn_layer.causal_conv1d = short_conv
    mlp.swiglu = lambda x, y: F.silu(x) * y
    mlp.swiglu_linear = lambda x, y, weight, bias: F.linear(F.silu(x) * y, weight, bias)


def torch_setup(mode: str, device: str, status: dict, autotune: str):
    """TF32 flags, the flash_attn stand-in, fla and transformers; returns the model loader."""
    import torch

    if device == "cuda" and autotune == "reduced":
        limit_triton_autotuning()           # before fla defines its kernels
    status["fla_autotune"] = autotune if device == "cuda" else None

    if mode in ("ieee", "softplus"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    status["stand_in_flash_attn"] = install_flash_attn_stand_in()
    import fla  # noqa: F401  (registers fla's model classes with transformers)
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    if device == "cpu":
        install_cpu_reference_ops()
    elif mode in ("ieee", "softplus"):
        status["forced_ieee"] = force_ieee_in_fla_kernels()
        if mode == "softplus":
            status["exact_softplus"] = exact_softplus_in_fla_gdn_gate()
    versions = {"python": sys.version.split()[0], "torch": torch.__version__,
                "transformers": transformers.__version__, "fla": getattr(fla, "__version__", "?")}
    for module in ("triton", "huggingface_hub", "tokenizers", "safetensors", "einops"):
        try:
            versions[module] = __import__(module).__version__
        except (ImportError, AttributeError):
            versions[module] = None
    if device == "cuda":
        versions["gpu"] = torch.cuda.get_device_name(0)
    status["versions"] = versions
    status["torch_flags"] = {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                             "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
                             "float32_matmul_precision": torch.get_float32_matmul_precision()}
    print(f"torch: {mode} {versions} stand-in flash_attn: {status['stand_in_flash_attn']}",
          flush=True)
    return AutoModelForCausalLM


def torch_side(work: Path, name: str, sizes, mode: str, device: str, autotune: str) -> int:
    """mode "ieee": float32 (true float32) and bf16 logits of every size; mode "tf32": float32
    logits at fla's and PyTorch's defaults, first size only; mode "softplus": float32 as "ieee"
    with an exact softplus in the GDN gate, every size."""
    import torch
    from safetensors.numpy import load_file

    status_file = work / name / f"torch_{mode}.json"
    status = {"device": device, "mode": mode, "sizes": {},
              "env": {"TRITON_F32_DEFAULT": os.environ.get("TRITON_F32_DEFAULT")}}
    write_json(status_file, status)
    try:
        AutoModelForCausalLM = torch_setup(mode, device, status, autotune)
    except BaseException as error:
        status["error"] = error_text(error)
        write_json(status_file, status)
        raise
    write_json(status_file, status)
    failed = False
    for index, size in enumerate(sizes[:1] if mode == "tf32" else sizes):
        folder = work / name / size_name(size)
        row = status["sizes"].setdefault(size_name(size), {})
        try:
            tokens = torch.from_numpy(np.load(folder / "tokens.npy")).long().to(device)
            expected = load_file(str(folder / "model.safetensors"))
            dtypes = ("float32", "bfloat16") if mode == "ieee" else ("float32",)
            for dtype in dtypes:
                label = {"tf32": "fp32_tf32", "softplus": "fp32_softplus"}.get(
                    mode, {"float32": "fp32", "bfloat16": "bf16"}[dtype])
                start = time.time()
                try:
                    model, info = AutoModelForCausalLM.from_pretrained(
                        folder, dtype=getattr(torch, dtype), output_loading_info=True)
                    model = model.to(device).eval()
                    row["class"] = type(model).__name__
                    problems = {k: sorted(map(str, v)) for k, v in info.items() if v}
                    if problems:
                        row[f"{label}_loading_info"] = problems
                    if dtype == "float32":      # every exported tensor loaded unchanged?
                        state = model.state_dict()
                        differ = [k for k, v in expected.items()
                                  if k not in state or not np.array_equal(
                                      state[k].detach().float().cpu().numpy(), v)]
                        row["weights_loaded_exactly"] = not differ
                        if differ:
                            row["weights_differing"] = differ[:20]
                    with torch.no_grad():
                        logits = model(input_ids=tokens, use_cache=False).logits
                    np.save(folder / f"fla_{label}.npy", logits.float().cpu().numpy())
                    row[f"{label}_seconds"] = round(time.time() - start, 1)
                    print(f"torch: {name} {size_name(size)} {label} logits "
                          f"({row[f'{label}_seconds']} s)", flush=True)
                    del model, logits
                    if device == "cuda":
                        torch.cuda.empty_cache()
                except Exception as error:
                    failed = True
                    row[f"{label}_error"] = error_text(error)
                    traceback.print_exc()
                write_json(status_file, status)
        except Exception as error:
            failed = True
            row["error"] = error_text(error)
            traceback.print_exc()
        write_json(status_file, status)
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------
# float64 oracle (a subprocess, numpy only): the export's forward in fla's conventions
# ----------------------------------------------------------------------------------------------


def _rms(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * weight


def _silu(x):
    return x / (1 + np.exp(-x))


def _f64_attention(w, x, num_heads, rope_theta, block=512):
    """Causal softmax attention of fla's Attention (rotate-half RoPE, base rope_theta) or, with
    f_proj, ForgettingAttention (bias sum_{s<u<=t} logsigmoid(f_u)); scale head_dim^-1/2."""
    length = x.shape[0]
    q, k, v = ((x @ w[f"{p}_proj.weight"].T).reshape(length, num_heads, -1).transpose(1, 0, 2)
               for p in "qkv")                                            # [H, T, D]
    dim = q.shape[-1]
    if rope_theta is not None:
        inv_freq = rope_theta ** (-np.arange(0, dim, 2) / dim)
        angles = np.arange(length)[:, None] * inv_freq                    # [T, D/2]
        cos, sin = np.cos(angles), np.sin(angles)

        def rope(y):
            y1, y2 = y[..., :dim // 2], y[..., dim // 2:]
            return np.concatenate([y1 * cos - y2 * sin, y2 * cos + y1 * sin], -1)

        q, k = rope(q), rope(k)
    cum = None
    if "f_proj.weight" in w:
        log_f = -np.logaddexp(0, -(x @ w["f_proj.weight"].T + w["f_proj.bias"]))  # [T, H]
        cum = np.cumsum(log_f, 0).T                                       # [H, T]
    out = np.empty_like(v)
    for start in range(0, length, block):
        stop = min(start + block, length)
        scores = q[:, start:stop] @ k[:, :stop].transpose(0, 2, 1) / np.sqrt(dim)
        if cum is not None:
            scores += cum[:, start:stop, None] - cum[:, None, :stop]
        causal = np.arange(start, stop)[:, None] >= np.arange(stop)[None, :]
        scores = np.where(causal, scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, start:stop] = (weights / weights.sum(-1, keepdims=True)) @ v[:, :stop]
    return out.transpose(1, 0, 2).reshape(length, -1) @ w["o_proj.weight"].T


def _f64_gated_deltanet(w, x, cfg):
    """fla's GatedDeltaNet: silu short convolutions, L2-normalised q/k (eps 1e-6 inside the
    sqrt), g = -exp(A_log) softplus(x W_a + dt_bias), beta = sigmoid(x W_b), value head j on q/k
    head j // (HV / H), o_t = S_t^T q_t / sqrt(K), RMSNorm(o) * w * silu(x W_g), o_proj."""
    head_k, length = cfg["head_dim"], x.shape[0]
    head_v = int(round(head_k * cfg["expand_v"]))

    def conv(name, y):
        weight = w[f"{name}_conv1d.weight"][:, 0]                           # [C, W]
        padded = np.concatenate([np.zeros((weight.shape[1] - 1, y.shape[1])), y])
        return _silu(sum(padded[j:j + length] * weight[:, j] for j in range(weight.shape[1])))

    def l2(y):
        return y / np.sqrt(np.sum(y * y, -1, keepdims=True) + 1e-6)

    q = l2(conv("q", x @ w["q_proj.weight"].T).reshape(length, -1, head_k))
    k = l2(conv("k", x @ w["k_proj.weight"].T).reshape(length, -1, head_k))
    v = conv("v", x @ w["v_proj.weight"].T).reshape(length, -1, head_v)
    gate = (x @ w["g_proj.weight"].T).reshape(length, -1, head_v)
    decay = np.exp(-np.exp(w["A_log"]) * np.logaddexp(0, x @ w["a_proj.weight"].T + w["dt_bias"]))
    beta = 1 / (1 + np.exp(-(x @ w["b_proj.weight"].T)))
    value_heads = v.shape[1]
    key_head = np.arange(value_heads) // (value_heads // q.shape[1])
    q, k = q[:, key_head] / np.sqrt(head_k), k[:, key_head]
    state = np.zeros((value_heads, head_k, head_v))
    out = np.empty_like(v)
    for t in range(length):
        state *= decay[t][:, None, None]
        error = v[t] - np.einsum("hk,hkv->hv", k[t], state)
        state += k[t][:, :, None] * (beta[t][:, None] * error)[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", q[t], state)
    normed = _rms(out, w["o_norm.weight"], cfg["norm_eps"]) * _silu(gate)
    return normed.reshape(length, -1) @ w["o_proj.weight"].T


def f64_logits(folder: Path, tokens) -> "np.ndarray":
    """float64 logits [B, T, V] of an fla-layout export (config.json, model.safetensors)."""
    from train.tools.safetensors_file import read_safetensors

    cfg = json.loads((folder / "config.json").read_text())
    tensors, _ = read_safetensors(folder / "model.safetensors")
    tensors = {name: t.astype(np.float64) for name, t in tensors.items()}
    eps, attn = cfg["norm_eps"], cfg.get("attn") or {}
    head = tensors.get("lm_head.weight", tensors["model.embeddings.weight"])
    rows = []
    for row in tokens:
        x = tensors["model.embeddings.weight"][row]
        for i in range(cfg["num_hidden_layers"]):
            prefix = f"model.layers.{i}."
            w = {n[len(prefix):]: t for n, t in tensors.items() if n.startswith(prefix)}
            mixer = {n[len("attn."):]: t for n, t in w.items() if n.startswith("attn.")}
            h = _rms(x, w["attn_norm.weight"], eps)
            if cfg["model_type"] == "gated_deltanet" and i not in attn.get("layers", []):
                x = x + _f64_gated_deltanet(mixer, h, cfg)
            elif cfg["model_type"] == "gated_deltanet":
                x = x + _f64_attention(mixer, h, attn["num_heads"], attn.get("rope_theta", 1e4))
            else:
                x = x + _f64_attention(mixer, h, cfg["num_heads"], cfg.get("rope_theta"))
            h = _rms(x, w["mlp_norm.weight"], eps)
            x = x + (_silu(h @ w["mlp.gate_proj.weight"].T) * (h @ w["mlp.up_proj.weight"].T)
                     ) @ w["mlp.down_proj.weight"].T
        rows.append(_rms(x, tensors["model.norm.weight"], eps) @ head.T)
    return np.stack(rows)


def f64_side(work: Path, name: str, sizes) -> int:
    status_file = work / name / "f64.json"
    status, failed = {"sizes": {}}, False
    for size in sizes:
        folder = work / name / size_name(size)
        row = status["sizes"].setdefault(size_name(size), {})
        start = time.time()
        try:
            np.save(folder / "f64.npy", f64_logits(folder, np.load(folder / "tokens.npy")))
            row["seconds"] = round(time.time() - start, 1)
            print(f"f64: {name} {size_name(size)} float64 logits ({row['seconds']} s)", flush=True)
        except Exception as error:
            failed = True
            row["error"] = error_text(error)
            traceback.print_exc()
        write_json(status_file, status)
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------
# Orchestration (this process): chains of subprocesses per family, then the table
# ----------------------------------------------------------------------------------------------


class Runner:
    """Starts the subprocesses, each with a log file under WORK and the common deadline."""

    def __init__(self, args, deadline: float):
        self.args, self.deadline = args, deadline
        self.lock = threading.Lock()
        self.records: dict[str, dict[str, dict]] = {}

    def report(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)

    def run(self, name: str, role: str, flags: list[str], env: dict) -> bool:
        left = self.deadline - FINISH_RESERVE - time.time()
        record = self.records.setdefault(name, {}).setdefault(role, {})
        if left < 5:
            record["status"] = "not started: time budget spent"
            self.report(f"== {name} {role}: not started, time budget spent")
            return False
        log = Path(self.args.work) / name / f"{role}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, os.path.abspath(__file__), *flags, "--work",
                   str(self.args.work), "--sizes", self.args.sizes, "--models", name,
                   "--torch-device", self.args.torch_device,
                   "--fla-autotune", self.args.fla_autotune,
                   "--tf32-check" if self.args.tf32_check else "--no-tf32-check"]
        start = time.time()
        with open(log, "w") as handle:
            niceness = 10 if role in DIAGNOSTIC_ROLES else 0     # the CPU goes to the rest first
            process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                       cwd=ROOT, start_new_session=True,
                                       preexec_fn=lambda: os.nice(niceness))
            try:
                rc = process.wait(timeout=left)
                record["status"] = "ok" if rc == 0 else f"exit status {rc}"
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()
                rc = None
                record["status"] = f"stopped by the time budget after {left:.0f} s"
        record["seconds"] = round(time.time() - start, 1)
        lines = log.read_text(errors="replace").splitlines()
        keep = lines if rc != 0 else lines[-LOG_TAIL_LINES:]
        keep = keep[-200:]
        self.report("\n".join([f"== {name} {role}: {record['status']} ({record['seconds']} s), "
                               f"log {log}" + (" (end)" if len(keep) < len(lines) else "")]
                              + [f"   {line}" for line in keep]))
        return rc == 0

    def chain(self, name: str, env_jax: dict, env_ieee: dict, env_tf32: dict | None) -> None:
        try:
            self.run(name, "jax_export", ["--jax-side", "export"], env_jax)
            if not list((Path(self.args.work) / name).glob("*/jax_fp32.npy")):
                return                      # no size exported: nothing to load into fla
            steps = [("jax_extras", ["--jax-side", "extras"], env_jax),
                     ("torch_ieee", ["--torch-side", "ieee"], env_ieee),
                     ("f64", ["--f64-side"], {**env_jax, **F64_THREADS})]
            if env_tf32 is not None:
                steps.append(("torch_tf32", ["--torch-side", "tf32"], env_tf32))
            if (self.args.softplus_check and self.args.torch_device == "cuda"
                    and "model.pattern=G" in " ".join(MODELS[name])):
                steps.append(("torch_softplus", ["--torch-side", "softplus"], env_ieee))
            threads = [threading.Thread(target=self.run, args=(name, role, flags, env))
                       for role, flags, env in steps]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        except Exception as error:          # keep the other families going
            self.records.setdefault(name, {})["chain"] = {"status": error_text(error)}
            self.report(f"== {name}: orchestration error\n{traceback.format_exc()}")


def environments(args) -> tuple[dict, dict, dict | None]:
    base = dict(os.environ)
    base["PYTHONUNBUFFERED"] = "1"
    base["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, base.get("PYTHONPATH")) if p)
    env_jax = {**base, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}   # several processes, one GPU
    if args.torch_device == "cpu":
        env_jax["JAX_PLATFORMS"] = "cpu"
    torch_base = {**base, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if args.wheels:
        site = "/tmp/hf_site"
        wheels = sorted(str(w) for folder in args.wheels.split(",")
                        for w in Path(folder).glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--upgrade", "--target", site, *wheels], check=True)
        torch_base["PYTHONPATH"] = os.pathsep.join((site, torch_base["PYTHONPATH"]))
    env_ieee = {**torch_base, "TRITON_F32_DEFAULT": "ieee", "FLA_TRIL_PRECISION": "ieee"}
    env_tf32 = {k: v for k, v in torch_base.items() if k != "TRITON_F32_DEFAULT"}
    return env_jax, env_ieee, (env_tf32 if args.tf32_check else None)


def relative_l2(a, b, rows=None) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if rows is not None:
        a, b = a[:, rows], b[:, rows]
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


PAIRS = {"fp32": ("fla_fp32", "jax_fp32"),
         "fla_vs_f64": ("fla_fp32", "f64"),
         "jax_vs_f64": ("jax_fp32", "f64"),
         "tf32_defaults": ("fla_fp32_tf32", "jax_fp32_default"),
         "bf16": ("fla_bf16", "jax_fp32"),
         "ref_fla_bf16": ("fla_bf16", "fla_fp32"),
         "ref_jax_bf16": ("jax_bf16", "jax_fp32"),
         "tf32_jax_only": ("jax_fp32_default", "jax_fp32"),
         "tf32_fla_only": ("fla_fp32_tf32", "fla_fp32"),
         "fla_tf32_vs_jax_fp32": ("fla_fp32_tf32", "jax_fp32"),
         "fp32_softplus": ("fla_fp32_softplus", "jax_fp32"),
         "fla_softplus_vs_f64": ("fla_fp32_softplus", "f64"),
         "fla_bf16_vs_f64": ("fla_bf16", "f64"),
         "jax_bf16_vs_f64": ("jax_bf16", "f64")}
TAILED = ("fp32", "fla_vs_f64", "jax_vs_f64", "fp32_softplus")


def compare(work: Path, name: str, size) -> dict:
    """Every relative error between the logits saved for one family and size (PAIRS), and
    for TAILED also over the first and the last 1/TAIL of the positions."""
    folder = work / name / size_name(size)
    logits = {}
    for label in {label for pair in PAIRS.values() for label in pair}:
        path = folder / f"{label}.npy"
        if path.exists():
            logits[label] = np.load(path)
    length = size[1]
    head, tail = slice(0, max(1, length // TAIL)), slice(length - max(1, length // TAIL), None)
    result = {}
    for key, (a, b) in PAIRS.items():
        if a in logits and b in logits:
            if logits[a].shape != logits[b].shape:
                result[key] = f"shape {logits[a].shape} != {logits[b].shape}"
                continue
            result[key] = relative_l2(logits[a], logits[b])
            if key in TAILED:
                result[f"{key}_head"] = relative_l2(logits[a], logits[b], head)
                result[f"{key}_tail"] = relative_l2(logits[a], logits[b], tail)
    return result


def read_status(work: Path, name: str, role_file: str) -> dict:
    path = work / name / role_file
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except (json.JSONDecodeError, OSError):
        return {}


def status_of(work: Path, name: str, role_file: str, size) -> dict:
    return read_status(work, name, role_file).get("sizes", {}).get(size_name(size), {})


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1e}"
    return str(value)


def rounding_only(fp32, fla, jax_) -> bool:
    """The two float32 results differ by what each is off from float64: JAX's own error at
    least a third of their difference and fla's no more than 3x JAX's."""
    return (isinstance(fp32, float) and isinstance(fla, float) and isinstance(jax_, float)
            and jax_ >= fp32 / 3 and fla <= 3 * jax_)


def fp32_verdict(errors: dict) -> tuple[str, bool]:
    """(text, passed): fp32 within FP32_TOLERANCE; or above it at float32 rounding
    (rounding_only); or that with fla's GDN gate given an exact softplus ("softplus" run): then
    the excess is fla's approximate softplus, not the conversion."""
    fp32, fla, jax_ = (errors.get(k) for k in ("fp32", "fla_vs_f64", "jax_vs_f64"))
    if fp32 <= FP32_TOLERANCE:
        return "fp32 ok", True
    if rounding_only(fp32, fla, jax_):
        return (f"fp32 ok at float32 rounding ({fp32:.1e} > {FP32_TOLERANCE:.0e}; from "
                f"float64: fla {fla:.1e}, JAX {jax_:.1e})"), True
    exact, exact_f64 = errors.get("fp32_softplus"), errors.get("fla_softplus_vs_f64")
    if isinstance(exact, float) and (exact <= FP32_TOLERANCE
                                     or rounding_only(exact, exact_f64, jax_)):
        return (f"fp32 ok with an exact softplus in fla's GDN gate ({exact:.1e}; {fp32:.1e} "
                f"with fla's approximate one)"), True
    return "FP32 FAIL", False


def verdict(errors: dict, notes: list[str]) -> tuple[str, bool]:
    fp32 = errors.get("fp32")
    if not isinstance(fp32, float):
        return "NOT RUN: " + ("; ".join(notes) if notes else "no fla float32 logits"), False
    text, passed = fp32_verdict(errors)
    parts = [text]
    refs = [errors.get(k) for k in ("ref_fla_bf16", "ref_jax_bf16")]
    refs = [r for r in refs if isinstance(r, float)]
    bf16 = errors.get("bf16")
    if isinstance(bf16, float) and refs:
        bf16_ok = bf16 <= BF16_FACTOR * max(refs)
        parts.append("bf16 ok" if bf16_ok else "BF16 FAIL")
        passed = passed and bf16_ok
    else:
        parts.append("bf16 not run")
        passed = False
    return ", ".join(parts), passed


def build_table(work: Path, names, sizes, records) -> tuple[str, dict, bool]:
    lines = ["| model | size | fla class | fp32 | fp32 tail | fla-f64 | JAX-f64 | TF32 dflt "
             "| bf16 | fla bf16 ref | JAX bf16 ref | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    results, all_pass = {}, True
    for name in names:
        results[name] = {"processes": records.get(name, {}), "sizes": {},
                         "torch": {k: v for k, v in read_status(work, name, "torch_ieee.json")
                                   .items() if k != "sizes"},
                         "jax": {k: v for k, v in read_status(work, name, "jax_export.json")
                                 .items() if k != "sizes"}}
        for size in sizes:
            errors = compare(work, name, size)
            torch_row = status_of(work, name, "torch_ieee.json", size)
            notes = []
            for role_file in ("jax_export.json", "torch_ieee.json", "f64.json"):
                top = read_status(work, name, role_file).get("error")
                if top:
                    notes.append(f"{role_file[:-5]}: {top}")
                row = status_of(work, name, role_file, size)
                notes += [f"{k}: {v}" for k, v in row.items() if k.endswith("error")]
            for role, record in records.get(name, {}).items():
                if record.get("status") not in (None, "ok"):
                    notes.append(f"{role}: {record['status']}")
            results[name]["sizes"][size_name(size)] = {
                "errors": errors, "jax": status_of(work, name, "jax_export.json", size),
                "jax_extras": status_of(work, name, "jax_extras.json", size),
                "torch_ieee": torch_row,
                "torch_tf32": status_of(work, name, "torch_tf32.json", size),
                "f64": status_of(work, name, "f64.json", size), "notes": notes}
            text, passed = verdict(errors, notes)
            all_pass = all_pass and passed
            if torch_row.get("weights_loaded_exactly") is False:
                text += ", WEIGHTS CHANGED ON LOAD"
                all_pass = False
            cells = [fmt(errors.get(k)) for k in ("fp32", "fp32_tail", "fla_vs_f64", "jax_vs_f64",
                                                   "tf32_defaults", "bf16", "ref_fla_bf16",
                                                   "ref_jax_bf16")]
            lines.append(f"| {name} | {size_name(size)} | {torch_row.get('class', '-')} | "
                         + " | ".join(cells) + f" | {text} |")
    return "\n".join(lines), results, all_pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="folder for verify_export_fla.md / .json (required)")
    parser.add_argument("--models", type=parse_models, default=list(MODELS),
                        help=f"comma-separated, of {','.join(MODELS)} (default all)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help=f"comma-separated LAYERSxLENGTH[xBATCH] (default {DEFAULT_SIZES})")
    parser.add_argument("--budget", type=float, default=500.0,
                        help="seconds until every process still running is stopped (default 500)")
    parser.add_argument("--jobs", type=int, default=4,
                        help="families verified side by side (default 4)")
    parser.add_argument("--tf32-check", action=argparse.BooleanOptionalAction, default=True,
                        help="also run both sides at their default precision, first size")
    parser.add_argument("--softplus-check", action=argparse.BooleanOptionalAction, default=True,
                        help="also run fla's GDN families in float32 with an exact softplus in "
                             "its gate (GPU only)")
    parser.add_argument("--torch-device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: fla's classes with PyTorch stand-ins for its Triton kernels")
    parser.add_argument("--fla-autotune", choices=("reduced", "full"), default="reduced",
                        help="reduced (default): one config per tile setting of each of fla's "
                             "autotuned Triton kernels (compile time); full: all of them")
    parser.add_argument("--wheels", default=None,
                        help="comma-separated folders of wheels installed (--no-deps) into "
                             "/tmp/hf_site for the PyTorch side, e.g. .whl,.whlhf")
    parser.add_argument("--work", default="/tmp/verify_export_fla")
    parser.add_argument("--jax-side", choices=("export", "extras"), help=argparse.SUPPRESS)
    parser.add_argument("--torch-side", choices=("ieee", "tf32", "softplus"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--f64-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        sizes = parse_sizes(args.sizes)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    work = Path(args.work)
    if args.jax_side:
        return jax_side(work, args.models[0], sizes, args.jax_side, args.tf32_check)
    if args.f64_side:
        return f64_side(work, args.models[0], sizes)
    if args.torch_side:
        return torch_side(work, args.models[0], sizes, args.torch_side, args.torch_device,
                          args.fla_autotune)
    if not args.out:
        parser.error("--out is required")
    if args.budget <= FINISH_RESERVE + 5 or args.jobs < 1:
        parser.error(f"--budget must exceed {FINISH_RESERVE + 5:.0f} s and --jobs be >= 1")
    start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models:            # no stale logits from an earlier run
        for old in (work / name).glob("*/*.npy"):
            old.unlink()
        for old in (work / name).glob("*.json"):
            old.unlink()
    work.mkdir(parents=True, exist_ok=True)
    env_jax, env_ieee, env_tf32 = environments(args)
    runner = Runner(args, start + args.budget)
    print(f"verify_export_fla: models {args.models}, sizes {[size_name(s) for s in sizes]}, "
          f"budget {args.budget:.0f} s, jobs {args.jobs}, torch device {args.torch_device}, "
          f"TF32 check {args.tf32_check}", flush=True)
    pending = list(args.models)
    active: list[threading.Thread] = []
    while pending or active:
        active = [t for t in active if t.is_alive()]
        while pending and len(active) < args.jobs:
            thread = threading.Thread(target=runner.chain,
                                      args=(pending.pop(0), env_jax, env_ieee, env_tf32))
            thread.start()
            active.append(thread)
        time.sleep(0.5)
    table, results, all_pass = build_table(work, args.models, sizes, runner.records)
    write_json(out / "verify_export_fla.json", {
        "base": BASE, "models": {n: MODELS[n] for n in args.models},
        "sizes": [size_name(s) for s in sizes], "perturbation": PERTURBATION,
        "fp32_tolerance": FP32_TOLERANCE, "bf16_factor": BF16_FACTOR, "tail_fraction": 1 / TAIL,
        "torch_device": args.torch_device, "seconds": round(time.time() - start, 1),
        "columns": {"fp32": "fla fp32 (IEEE) vs JAX fp32 (highest)",
                    "fp32 tail": f"the same over the last 1/{TAIL} of the positions",
                    "fla-f64": "fla fp32 (IEEE) vs the float64 numpy forward in fla's "
                               "conventions (f64_logits)",
                    "JAX-f64": "JAX fp32 (highest) vs the same float64 forward",
                    "fp32_softplus (JSON)": "fla fp32 (IEEE) with an exact softplus in the GDN "
                                            "gate vs JAX fp32",
                    "TF32 dflt": "fla fp32 at its defaults vs JAX fp32 at default precision",
                    "bf16": "fla bf16 vs JAX fp32 (highest)",
                    "fla bf16 ref": "fla bf16 vs fla fp32 (IEEE)",
                    "JAX bf16 ref": "JAX bf16 (model.dtype=bfloat16) vs JAX fp32 (highest)"},
        "results": results})
    legend = (f"\nRelative L2 error of the logits. fp32: fla float32 with TF32 off and "
              f"TRITON_F32_DEFAULT=ieee vs JAX float32 at matmul precision 'highest' (target "
              f"{FP32_TOLERANCE:.0e}, or each side as far from float64: float32 rounding); "
              f"fp32 tail: the last 1/{TAIL} of the positions; fla-f64, JAX-f64: each side's "
              f"float32 logits vs a float64 numpy forward in fla's conventions; TF32 "
              f"dflt: both at their default precision; bf16: fla bfloat16 vs JAX float32, "
              f"passing within {BF16_FACTOR:g}x the larger of the refs (each framework's own "
              f"bf16 vs fp32). Sizes LxTxB: layers, length, batch. Torch device: "
              f"{args.torch_device}; {time.time() - start:.0f} s.\n")
    (out / "verify_export_fla.md").write_text(table + "\n" + legend)
    print(legend)
    print(table, flush=True)
    return 0 if all_pass else 1


if __name__ == "__main__":
    sys.exit(main())
