"""benchmarks/timing.py: with calls per sample, every sample runs that many calls back to back and
reports the time per call; the warm-up calls are not timed."""

import time

import jax.numpy as jnp

from benchmarks import timing


def test_samples_of_back_to_back_calls_report_the_time_per_call():
    count = []

    def slow(x):
        count.append(1)
        time.sleep(0.02)
        return x + 1

    ms = timing.jax_median_ms(slow, jnp.zeros(()), warmup=2, repeats=3, calls=4)
    assert len(count) == 2 + 3 * 4
    assert 15 < ms < 60, ms          # 20 ms per call, not 80 per sample


def test_torch_side_on_the_cpu_reports_the_time_per_call():
    count = []

    def slow():
        count.append(1)
        time.sleep(0.02)

    ms = timing.torch_median_ms(slow, "cpu", warmup=1, repeats=2, calls=3)
    assert len(count) == 1 + 2 * 3
    assert 15 < ms < 60, ms
