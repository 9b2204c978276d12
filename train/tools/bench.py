"""Train-step throughput, peak memory and model FLOPs utilisation of a config on random tokens.

    tokens/s     batch_size * seq_len * steps / seconds, after `warmup` untimed steps; the
                 steps are timed twice (TIMED_WINDOWS) and the faster window counts, because
                 a one-time cost can land after the warm-up (on an H200 the GDN step's first
                 timed window ran at 91-109 ms per step where the device was busy 58 ms)
    memory       the device allocator's peak_bytes_in_use where it has one (GPU), else XLA's
                 compiled memory analysis: arguments + outputs + temporaries - aliased; beside
                 it train/core/memory.py's estimate per device (meant to err low: estimate / peak < 1)
    batch        uniform random tokens, one document per row (segment_ids all 1)
    fit          before compiling, the step's memory estimate is checked against the device's
                 (train/core/memory.py, as `fit` does); XLA's out-of-memory is one DeviceMemoryError

Model FLOPs per token (training = forward + backward = 3 x forward; T = seq_len; the terms of
the sequence mixers are their kinds' `MixerSpec.flops`, train/core/mixers.py):

    F = 6 * N  +  sum over attention layers  3 * H * (D_qk + D_v) * (T + 1)
               +  sum over GDN layers        3 * HV * (6 * K * V + (2 K + V) * (C + 1))

    N     parameters that multiply activations: all of them, less the input embedding table
          when it is not tied to the output head (a lookup costs no FLOPs), less, in MoE
          layers, the experts a token is not routed to: (E - k) * 3 * D * F per layer (each
          token runs k of the E SwiGLU experts of width F; the router is counted)
    attn  causal: token t attends to t + 1 keys, (T + 1) / 2 on average; per key the forward
          does 2 D_qk FLOPs for q.k and 2 D_v for p v: 2 H (D_qk + D_v) (T + 1) / 2.
          D_qk = 0 for FPA without content (the logits are the bias alone)
    GDN   per token and value head, chunks of C tokens (the layer's chunk_size): the state
          S [K, V] is read by q and by k and updated by a rank-1 write (3 x 2 K V), and the
          intra-chunk part attends causally to (C + 1) / 2 tokens with q.k, k.k (the WY form)
          and p v: 2 (2 K + V) (C + 1) / 2
    The small terms (norms, gates, convolutions, softmax exponentials, the triangular solve of
    the WY form) are left out, so F is a slight undercount, as is usual for MFU.

    achieved TFLOP/s   F * tokens/s / 1e12 (all devices); per device: / device count
    matmul ceiling     TFLOP/s of one jitted bf16 n x n @ n x n matmul (2 n^3 FLOPs) timed on
                       device 0 in the same run (n = 8192 on GPU, 256 elsewhere)
    MFU                achieved TFLOP/s per device / matmul ceiling

`profile_dir`: after the timed steps, `profile_steps` more steps run under jax.profiler.trace;
the trace (plugins/profile/<run>/*.xplane.pb) opens in TensorBoard's profile plugin, and the
*.trace.json.gz beside it in Perfetto. `top_ops` sums that trace's complete events by name on
the device timelines ("/device:..." processes; on CPU, the XLA executor threads without their
C++ scaffolding, "...::...") and keeps the costliest, as a share of their total.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from train.core.config import Config
from train.core.memory import (check_fits, device_memory_bytes, estimate_train_memory,
                               out_of_memory_errors)
from train.core.mixers import MIXERS, layer_kinds
from train.core.model import count_params, resolve_vocab_size
from train.core.session import build_session, local_batch_size, to_global
from train.core.sharding import mesh_context
from train.data.tokenizer import load_tokenizer
from train.tools.profile_trace import event_totals

TIMED_WINDOWS = 2


def model_flops_per_token(config: Config, params: int, vocab_size: int) -> dict[str, float]:
    """The terms of F (module doc) for `config` with `params` parameters and the model's
    (padded) `vocab_size`: {"dense", "attention", "recurrence", "total"} FLOPs per token."""
    m = config.model
    matmul_params = params - (0 if m.tie_embeddings else vocab_size * m.d_model)
    if m.moe_experts:   # each token runs top_k of the experts
        expert_dim = m.moe_expert_dim or config.mlp_dim()
        matmul_params -= (m.num_layers * (m.moe_experts - m.moe_top_k)
                          * 3 * m.d_model * expert_dim)
    mixing = {"attention": 0, "recurrence": 0}
    for kind in layer_kinds(config):
        mixing[MIXERS[kind].flops_term] += MIXERS[kind].flops(config)
    dense = 6 * matmul_params
    return {"dense": float(dense), **{term: float(value) for term, value in mixing.items()},
            "total": float(dense + sum(mixing.values()))}


def matmul_ceiling_tflops(size: int, *, device: Any = None, repeats: int = 10) -> float:
    """TFLOP/s of a jitted bf16 [size, size] @ [size, size] matmul on `device` (median of
    `repeats` timed calls after one untimed call)."""
    device = jax.devices()[0] if device is None else device
    keys = jax.random.split(jax.random.PRNGKey(0))
    a, b = (jax.device_put(jax.random.normal(key, (size, size), jnp.bfloat16), device)
            for key in keys)
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(matmul(a, b))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(matmul(a, b))
        times.append(time.perf_counter() - started)
    return 2 * size ** 3 / statistics.median(times) / 1e12


def top_ops(profile_dir: str | Path, count: int = 6) -> list[tuple[str, float]]:
    """[(op name, share of device time)] of the newest trace under `profile_dir`, costliest
    first (see the module doc); [] when the trace has no device or executor events."""
    totals = event_totals(profile_dir)
    whole = sum(totals.values())
    return [(name, value / whole) for name, value in totals.most_common(count)] if whole else []


def default_ceiling_size(platform: str) -> int:
    return 8192 if platform == "gpu" else 256


def random_batch(config: Config, vocab_size: int) -> dict[str, np.ndarray]:
    """This process's rows of uniform random tokens (seed train.seed), one document per row."""
    rows, seq_len = local_batch_size(config), config.data.seq_len
    rng = np.random.default_rng(config.train.seed)
    return {"tokens": rng.integers(0, vocab_size, (rows, seq_len + 1), np.int32),
            "segment_ids": np.ones((rows, seq_len + 1), np.int32)}


def benchmark(config: Config, *, steps: int, warmup: int = 2, profile_dir: str | Path | None = None,
              profile_steps: int = 3, ceiling_size: int | None = None) -> dict[str, Any]:
    """Time TIMED_WINDOWS windows of `steps` train steps of `config`, the faster counting
    (vocabulary: model.vocab_size, else the configured tokenizer's); see the module doc."""
    if steps < 1 or warmup < 0 or profile_steps < 1:
        raise ValueError(f"steps and profile_steps must be >= 1 and warmup >= 0, got "
                         f"steps={steps}, warmup={warmup}, profile_steps={profile_steps}")
    if ceiling_size is not None and ceiling_size < 1:
        raise ValueError(f"ceiling_size must be >= 1, got {ceiling_size}")
    tokenizer_vocab = config.model.vocab_size or load_tokenizer(config.data.tokenizer).vocab_size
    session = build_session(config, tokenizer_vocab)
    estimate = estimate_train_memory(config, session.abstract_state, tokenizer_vocab,
                                     session.mesh.shape)
    check_fits(config, estimate, device_memory_bytes())                 # before compiling
    seq_len = config.data.seq_len
    local = random_batch(config, tokenizer_vocab)
    with mesh_context(session.mesh), out_of_memory_errors(config):
        batch = to_global(session, local)
        init_started = time.time()
        state = jax.block_until_ready(session.init_state())
        init_seconds = time.time() - init_started
        compile_started = time.time()
        compiled = session.train_step.lower(state, batch).compile()
        compile_seconds = time.time() - compile_started
        for _ in range(warmup):
            state, metrics = compiled(state, batch)
        jax.block_until_ready(state)
        windows = []
        for _ in range(TIMED_WINDOWS):
            started = time.time()
            for _ in range(steps):
                state, metrics = compiled(state, batch)
            jax.block_until_ready((state, metrics))
            windows.append(time.time() - started)
        seconds = min(windows)
        if profile_dir is not None:
            with jax.profiler.trace(str(profile_dir)):
                for _ in range(profile_steps):
                    state, metrics = compiled(state, batch)
                jax.block_until_ready((state, metrics))
    device = jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        peak, source = int(stats["peak_bytes_in_use"]), "allocator peak_bytes_in_use (device 0)"
    else:
        analysis = compiled.memory_analysis()
        peak = int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes
                   + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes)
        source = "compiled memory analysis (per device)"

    params = count_params(session.abstract_state["params"])
    flops = model_flops_per_token(config, params, resolve_vocab_size(config, tokenizer_vocab))
    tokens_per_second = config.data.batch_size * seq_len * steps / seconds
    achieved = flops["total"] * tokens_per_second / 1e12
    size = ceiling_size or default_ceiling_size(device.platform)
    ceiling = matmul_ceiling_tflops(size, device=device)
    return {
        "config": config.name, "platform": device.platform, "device": device.device_kind,
        "devices": jax.device_count(), "seq_len": seq_len, "batch_size": config.data.batch_size,
        "params": params,
        "steps": steps, "compile_seconds": compile_seconds,
        "init_seconds": init_seconds,
        "seconds_per_step": seconds / steps,
        "window_seconds": windows,
        "tokens_per_second": tokens_per_second,
        "peak_memory_bytes": peak, "memory_source": source,
        "memory_estimate_bytes": estimate.total_bytes,
        "final_loss": float(metrics["loss"]),
        "model_flops_per_token": flops["total"], "flops_terms": flops,
        "achieved_tflops": achieved,
        "achieved_tflops_per_device": achieved / jax.device_count(),
        "matmul_ceiling_tflops": ceiling, "matmul_ceiling_size": size,
        "mfu": achieved / jax.device_count() / ceiling,
        "profile_dir": None if profile_dir is None else str(profile_dir),
        "top_ops": [] if profile_dir is None else top_ops(profile_dir),
    }
