"""Measurement helpers shared by the benchmark scripts; no framework is imported at load time.

    jax_median_ms(fn, *args)      `warmup` calls, then the median wall time (ms) of `repeats`
                                  samples, each `calls` back-to-back calls ended by one
                                  jax.block_until_ready, per call (calls = 1: each call alone,
                                  with its dispatch and synchronisation)
    torch_median_ms(fn, device)   the same for PyTorch: CUDA events on "cuda", else perf_counter
    compiled_memory(compiled)     XLA's memory analysis of a compiled program, in bytes:
                                  {argument, output, temp, alias}; peak = argument + output + temp
    torch_peak_bytes(fn, device)  the CUDA allocator's peak during one call (inputs included)
    tflops(flops, ms)             flops / (ms * 1e-3) / 1e12

The JAX side imports only JAX and the PyTorch side only PyTorch, so the two frameworks never
share a process (nor the GPU's memory).
"""

import statistics
import time


def jax_median_ms(fn, *args, warmup=3, repeats=10, calls=1):
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        results = [fn(*args) for _ in range(calls)]
        jax.block_until_ready(results)
        times.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(times)


def torch_median_ms(fn, device, warmup=3, repeats=10, calls=1):
    for _ in range(warmup):
        fn()
    if device != "cuda":
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - start) * 1e3 / calls)
        return statistics.median(times)
    import torch

    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def compiled_memory(compiled):
    """Bytes of a compiled program (`jax.jit(f).lower(*args).compile()`), or None where the
    backend gives no memory analysis."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    memory = {name: int(getattr(stats, f"{name}_size_in_bytes", 0))
              for name in ("argument", "output", "temp", "alias")}
    memory["peak"] = memory["argument"] + memory["output"] + memory["temp"]
    return memory


def torch_peak_bytes(fn, device):
    """Peak bytes the CUDA allocator held during one call of fn; None unless device is "cuda"."""
    import torch

    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def tflops(flops, milliseconds):
    if flops is None or not milliseconds:
        return None
    return flops / (milliseconds * 1e-3) / 1e12

