"""The device-memory estimate of a train step and the out-of-memory error
(train/core/memory.py)."""


import jax
import pytest

import train.core.fit
import train.core.memory
from tests.seeds import case_seed
from tests.train import tiny_run
from train.cli.entry import main
from train.core.memory import (DeviceMemoryError, check_fits, estimate_train_memory,
                               out_of_memory_error)
from train.core.presets import load_config
from train.core.session import build_session


TINY = tiny_run.TINY


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_run.write_corpus(tmp_path_factory.mktemp("corpus"), seed=case_seed(1200))


def test_memory_estimate_scales_and_refuses_what_cannot_fit():
    config = load_config(None, TINY)
    session = build_session(config, 257)                      # abstract shapes only
    estimate = estimate_train_memory(config, session.abstract_state, 257, (1, 1, 1))
    params = sum(x.size for x in jax.tree.leaves(session.abstract_state["params"]))
    assert estimate.gradient_bytes == 4 * params
    # params + adam mu, nu (+ a few step counters)
    assert 3 * 4 * params <= estimate.state_bytes <= 3 * 4 * params + 64
    assert estimate.tokens_per_device == 2 * 16

    def estimate_for(*more):
        c = load_config(None, [*TINY, *more])
        return estimate_train_memory(c, session.abstract_state, 257, (1, 1, 1))

    doubled = estimate_for("data.batch_size=4")
    assert doubled.activation_bytes == 2 * estimate.activation_bytes
    assert estimate_for("data.batch_size=4", "train.grad_accum=2").activation_bytes == \
        estimate.activation_bytes                              # one micro-batch is live
    deep = estimate_for("model.num_layers=4").activation_bytes
    assert estimate.activation_bytes < deep
    assert estimate_for("model.num_layers=4", "model.remat=true").activation_bytes < deep
    assert estimate_train_memory(config, session.abstract_state, 257,
                                 (2, 1, 1)).tokens_per_device == 16
    assert estimate_train_memory(config, session.abstract_state, 257,
                                 (1, 1, 1, 4)).tokens_per_device == 8   # time split over context

    check_fits(config, estimate, None)                         # CPU: nothing to compare to
    check_fits(config, estimate, estimate.total_bytes)
    with pytest.raises(DeviceMemoryError, match=r"lower data.batch_size \(2\) or data.seq_len "
                                                r"\(16\), raise train.grad_accum"):
        check_fits(config, estimate, estimate.total_bytes - 1)


def test_out_of_memory_becomes_one_error_line(tmp_path, corpus, capsys, monkeypatch):
    config = load_config(None, TINY)
    oom = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17.18GiB.\nmore detail")
    mapped = out_of_memory_error(oom, config)
    assert isinstance(mapped, DeviceMemoryError) and "17.18GiB" in str(mapped)
    assert "set model.remat=true" in str(mapped)
    # XLA's GPU autotuner words it on a later line (seen on an H200, 2026-12-01)
    autotuner = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Failed to get configs for: 5 out of 176 instructions. Example "
        "failure:\n  %fusion = ...\nStatus: RESOURCE_EXHAUSTED: Out of memory while trying to "
        "allocate 128.02GiB with allocator GPU_0_bfc on device 0.")
    assert "(could not allocate 128.02GiB)" in str(out_of_memory_error(autotuner, config))
    assert out_of_memory_error(jax.errors.JaxRuntimeError("INTERNAL: other"), config) is None
    assert out_of_memory_error(MemoryError("host"), config) is None

    argv = ["fit", "tiny_softmax", *TINY, f"data.source={corpus}", "train.steps=2",
            "train.tensorboard=false"]
    # a device that reports 64 KiB: refused before compiling, no run directory left behind
    monkeypatch.setattr(train.core.fit, "device_memory_bytes", lambda: 2**16)
    assert main([*argv, "--run-dir", str(tmp_path / "small")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "compiling" not in "\n".join(err) and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("error: the train step needs at least") and "64.00 KiB" in err[-1]
    assert not (tmp_path / "small").exists()
    monkeypatch.undo()

    # XLA runs out of memory in the step: one line too
    original = train.core.fit.build_session

    def build_session_that_runs_out(*args, **kwargs):
        session = original(*args, **kwargs)

        def train_step(state, batch):
            raise oom

        session.train_step = train_step
        return session

    monkeypatch.setattr(train.core.fit, "build_session", build_session_that_runs_out)
    assert main([*argv, "--run-dir", str(tmp_path / "oom")]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: out of device memory (could not allocate ")
    assert "lower data.batch_size (2)" in last
