"""Train-step throughput and peak memory of a config on random tokens (no data needed).

    tokens/s   batch_size * seq_len * steps / seconds, after `warmup` untimed steps
    memory     the device allocator's peak_bytes_in_use where it has one (GPU), else XLA's
               compiled memory analysis: arguments + outputs + temporaries - aliased
    batch      uniform random tokens, one document per row (segment_ids all 1)
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from train.config import Config
from train.model import count_params
from train.session import build_session, local_batch_size, to_global
from train.sharding import mesh_context
from train.tokenizer import load_tokenizer


def benchmark(config: Config, *, steps: int, warmup: int = 2) -> dict[str, Any]:
    """Time `steps` train steps of `config` (vocabulary: model.vocab_size, else the
    configured tokenizer's); see the module doc for what is measured."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    vocab_size = config.model.vocab_size or load_tokenizer(config.data.tokenizer).vocab_size
    session = build_session(config, vocab_size)
    batch_size, seq_len = local_batch_size(config), config.data.seq_len
    rng = np.random.default_rng(config.train.seed)
    local = {"tokens": rng.integers(0, vocab_size, (batch_size, seq_len + 1), np.int32),
             "segment_ids": np.ones((batch_size, seq_len + 1), np.int32)}
    with mesh_context(session.mesh):
        batch = to_global(session, local)
        state = session.init_state()
        compile_started = time.time()
        compiled = session.train_step.lower(state, batch).compile()
        compile_seconds = time.time() - compile_started
        for _ in range(warmup):
            state, metrics = compiled(state, batch)
        jax.block_until_ready(state)
        started = time.time()
        for _ in range(steps):
            state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        seconds = time.time() - started
    device = jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        peak, source = int(stats["peak_bytes_in_use"]), "allocator peak_bytes_in_use (device 0)"
    else:
        analysis = compiled.memory_analysis()
        peak = int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes
                   + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes)
        source = "compiled memory analysis (per device)"
    return {
        "config": config.name, "platform": device.platform, "device": device.device_kind,
        "devices": jax.device_count(), "seq_len": seq_len, "batch_size": config.data.batch_size,
        "params": count_params(session.abstract_state["params"]),
        "steps": steps, "compile_seconds": compile_seconds,
        "seconds_per_step": seconds / steps,
        "tokens_per_second": config.data.batch_size * seq_len * steps / seconds,
        "peak_memory_bytes": peak, "memory_source": source,
        "final_loss": float(metrics["loss"]),
    }
