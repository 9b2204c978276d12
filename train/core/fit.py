"""The training loop: train a config in a run directory, resuming from its newest checkpoint.

    fresh run    state = init (or hooks.initial's params), extra = hooks.initial's record
    resumed run  state, data iterator = the newest readable checkpoint;
                 extra = hooks.resume(restored) (default: the checkpoint's own record["extra"])
    each step    state, metrics = train_step(state, next batch)     (train/core/step.py)
    every k      eval (train.eval_every), async checkpoint (train.checkpoint_every) of
                 state + data iterator + {config, extra}
    the end      eval, final checkpoint; SIGTERM/SIGINT: save the current step and stop
    non-finite   a step whose loss or gradient norm is not finite changes nothing but the step
                 counter (train/core/session.py guard_nonfinite); it is noticed at the next log
                 point or checkpoint, where train.on_nonfinite="stop" raises DivergenceError
                 before anything more is saved, and "skip" counts it (metrics kind "skipped")
                 and goes on. The same checks test the parameters and optimizer state exactly
                 (session state_finite): an update from a finite loss and gradient norm that
                 made them non-finite (an overflow; see guard_nonfinite) raises DivergenceError
                 in both modes, as it is already applied. Saved states are therefore always
                 finite.
    run dir      locked for one writer, removed again if the run fails before its first
                 metric or checkpoint (train/core/runs.py claimed_run_dir)
    startup      before compiling: devices and mesh, parameter count, tokens per step, the
                 run directory, the persistent compilation cache (train.compile_cache,
                 train/core/compile_cache.py) and the memory estimate (train/core/memory.py); a
                 step that cannot fit device memory is refused (DeviceMemoryError), as is an
                 XLA out-of-memory later; then "compiling..." around the first step, whose
                 time stays out of the ETA and tokens/s
    metrics      records up to a checkpoint's step are flushed before it is saved; a resumed
                 run first drops the records after its checkpoint (they are replayed) and
                 rebuilds the TensorBoard events (train/core/metrics.py)
    data order   data.shuffle must match the run's config.json when resuming (the data
                 iterator state of one mode cannot restore the other): RunSetupError
    setup        a ValueError before the first step (data, tokenizer, checkpoint record, the
                 hooks) is the user's inputs not fitting together: raised as RunSetupError

`extra` is the caller's record kept with every checkpoint; `fit` carries it without reading
it (continued pretraining, train/experiments/cpt.py, keeps its SpectralShift markers there).
A resumed run continues the same loss trajectory: params, optimizer state, step and the grain
iterator all come from the checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from train.checkpoint.manager import Checkpointer, RestoredCheckpoint
from train.checkpoint.preemption import PreemptionFlag, install_preemption_handler
from train.checkpoint.run_files import CONFIG_FILENAME, load_run_config, save_run_files
from train.checkpoint.state_tree import StateMismatchError
from train.core import compile_cache
from train.core.config import Config, ConfigError, config_differences
from train.core.evaluate import evaluate
from train.core.memory import (MemoryEstimate, check_fits, device_memory_bytes, describe_limit,
                               estimate_train_memory, out_of_memory_error)
from train.core.metrics import MetricsWriter, ProgressBar, format_duration
from train.core.model import count_params
from train.core.runs import checkpoint_dir, checkpoint_steps, claimed_run_dir
from train.core.session import (RETIRED_STATE_KEYS, Session, build_session, make_split_dataset,
                                to_global)
from train.core.sharding import mesh_context
from train.data.tokenizer import load_tokenizer


@dataclasses.dataclass(frozen=True)
class FitHooks:
    """What a caller changes about a run's start, without `fit` knowing why.

    initial(session) -> (params or None, extra): a fresh run starts from these params (None:
        the random init) and saves `extra` with its checkpoints.
    resume(restored) -> extra: a resumed run's checkpoint (RestoredCheckpoint); returns
        the extra to save from now on, or raises to refuse the run directory.
    """

    initial: Callable[[Session], tuple[Any, dict[str, Any]]] | None = None
    resume: Callable[[RestoredCheckpoint], dict[str, Any]] | None = None


@dataclasses.dataclass
class FitResult:
    run_dir: Path
    params: int                     # number of model parameters
    steps: int                      # step reached
    start_step: int                 # 0, or the step resumed from
    train_loss: float | None        # mean over the last logging window
    eval_loss: float | None         # of the latest evaluation in this process
    eval_step: int | None           # its step
    tokens_per_second: float
    checkpoint_dir: Path
    latest_checkpoint: int | None
    wall_seconds: float
    preempted: bool
    eval: dict[str, Any] | None
    skipped_steps: int = 0          # non-finite steps skipped over the run, resumes included


class RunSetupError(ValueError):
    """A ValueError before the first step: the run's inputs do not fit together (an empty data
    source, a tokenizer or shard mismatch, a CPT reference that does not fit, ...)."""


_OUR_PACKAGES = tuple(Path(__file__).resolve().parents[2] / name
                      for name in ("train", "fpa_jax", "gdn_jax", "mixer_kernels", "mixer_core"))


def _raised_by_an_input_check(error: BaseException) -> bool:
    """True when the innermost frame of the traceback is in this repository's packages: an
    explicit `raise ValueError(...)` of an input check, not a library's or a bug's ValueError
    (numpy broadcasting, a jnp shape error), which keeps its traceback."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    if frame is None:
        return False
    path = Path(frame.tb_frame.f_code.co_filename).resolve()
    return any(path.is_relative_to(package) for package in _OUR_PACKAGES)


@contextlib.contextmanager
def _setup_errors():
    """ValueErrors of the inputs' checks before the first step become RunSetupError (one line
    in the CLI); any other error passes unchanged."""
    try:
        yield
    except (RunSetupError, ConfigError):
        raise
    except ValueError as error:
        if not _raised_by_an_input_check(error):
            raise
        raise RunSetupError(str(error)) from error


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """"key: old -> new" for every dotted key whose value differs."""
    return [f"{key}: {before!r} -> {after!r}"
            for key, (before, after) in config_differences(old, new).items()]


def _restore_latest(checkpointer, session, data_iterator, run_dir: Path, config: Config):
    """The newest readable checkpoint (None if there is none). A state that no longer matches
    the config's model is a RunSetupError naming the config keys that changed."""
    try:
        return checkpointer.restore_latest(session.abstract_state, data_iterator=data_iterator,
                                           ignore_saved=RETIRED_STATE_KEYS)
    except StateMismatchError as error:
        changes = _changes(load_run_config(run_dir), config.to_dict())
        shown = "; ".join(changes[:6]) + (f" (+{len(changes) - 6} more)" if len(changes) > 6
                                          else "")
        raise RunSetupError(
            f"{run_dir}: the model or optimizer state no longer matches the checkpoint "
            f"(config changes: {shown or 'none'}); a run keeps its model and optimizer: undo "
            f"those changes, or start another run with --new or another --run-dir. "
            f"First difference: {error.problems[0]}") from error


class DivergenceError(RuntimeError):
    """The loss or gradient norm became non-finite and train.on_nonfinite is "stop", or the
    parameters or optimizer state became non-finite (either mode)."""


def fit(config: Config, run_dir: str | Path, *, hooks: FitHooks = FitHooks(),
        mesh: Mesh | None = None) -> FitResult:
    """Train `config` in `run_dir`, resuming from its newest checkpoint if there is one.
    Raises DivergenceError (see the module doc) and runs.RunLockedError."""
    with claimed_run_dir(run_dir) as run_dir:
        with _setup_errors():
            cache = compile_cache.RunCache(config.train.compile_cache, run_dir)
        with cache as cache_line:   # before anything compiles; left before the dir's cleanup
            return _fit_locked(config, run_dir, hooks, mesh, cache_line)


def _fit_locked(config: Config, run_dir: Path, hooks: FitHooks, mesh: Mesh | None,
                cache_line: str) -> FitResult:
    started = time.time()
    t = config.train
    with _setup_errors():
        _check_data_order(config, run_dir)
        tokenizer = load_tokenizer(config.data.tokenizer)
        session = build_session(config, tokenizer.vocab_size, mesh)
        save_run_files(run_dir, config=config.to_dict(), tokenizer=tokenizer)
        train_iterator = iter(make_split_dataset(config, tokenizer, "train"))
        eval_dataset = make_split_dataset(config, tokenizer, "eval")
    memory = estimate_train_memory(config, session.abstract_state, tokenizer.vocab_size,
                                   session.mesh.shape)
    memory_limit = device_memory_bytes()
    check_fits(config, memory, memory_limit)     # before anything is allocated or compiled
    checkpointer = Checkpointer(
        checkpoint_dir(run_dir), max_to_keep=t.keep_checkpoints,
        save_interval_steps=t.checkpoint_every or (t.steps + 1))
    bar = ProgressBar(t.steps)

    try:
        with _setup_errors():
            restored = _restore_latest(checkpointer, session, train_iterator, run_dir, config)
            if restored is not None:
                state, start_step = restored.state, restored.step
                progress = restored.record.get("progress", {})
                skipped_before = int(progress.get("skipped_steps", 0))
                extra = (hooks.resume(restored) if hooks.resume
                         else dict(restored.record.get("extra", {})))
                bar.message(f"resumed from step {start_step} ({checkpointer.directory})")
                changes = _changes(restored.record.get("config", {}), config.to_dict())
                if changes:
                    bar.message("warning: the config differs from the checkpoint's in "
                                + "; ".join(changes))
            else:
                init_started = time.time()
                state, start_step, skipped_before = session.init_state(), 0, 0
                bar.message(f"initial state drawn in {format_duration(time.time() - init_started)} "
                            f"(train.init_on={config.train.init_on})")
                params, extra = hooks.initial(session) if hooks.initial else (None, {})
                if params is not None:
                    state["params"] = jax.device_put(params, session.state_shardings["params"])
        _startup_report(config, session, run_dir, bar, memory, memory_limit, cache_line)
    except BaseException as error:
        checkpointer.close()
        if isinstance(error, Exception):
            _raise_out_of_memory(error, config)      # the state may not fit either
        raise
    try:
        with _setup_errors():       # a damaged metrics.jsonl (metrics.MetricsFileError)
            writer = MetricsWriter(run_dir, tensorboard=t.tensorboard, resume_step=start_step)
    except BaseException:
        checkpointer.close()
        raise

    step = start_step
    log = _StepLog(writer, bar, t.steps, config.data.batch_size * config.data.seq_len, start_step)
    eval_loss = eval_step = None
    last_eval: dict[str, Any] | None = None
    preempted = False
    unchecked: list[tuple[int, dict[str, jax.Array]]] = []
    skipped_steps = skipped_before      # over the whole run (kept in the checkpoint record)

    def check_finite() -> None:
        """Stops (or counts) the non-finite steps since the last check; stops on non-finite
        parameters or optimizer state (such a state is never saved)."""
        nonlocal skipped_steps
        if not unchecked:
            return              # no step since the last check: the state was checked
        since = unchecked[0][0]
        parts_ok, flags = jax.device_get((
            session.state_finite(state),
            [(s, m["nonfinite"], m["loss"], m["grad_norm"]) for s, m in unchecked]))
        unchecked.clear()
        bad = [(s, float(loss), float(norm)) for s, flag, loss, norm in flags if flag]
        latest = checkpointer.latest_step()
        saved = ("no checkpoint was saved" if latest is None else
                 f"nothing after checkpoint step {latest} was saved")
        if bad and t.on_nonfinite == "stop":
            first = bad[0]
            raise DivergenceError(
                f"training diverged: non-finite loss {first[1]} / gradient norm {first[2]} "
                f"at step {first[0]} ({len(bad)} such step(s) since the last check); {saved}. "
                "Lower optim.lr, or set train.on_nonfinite=skip to skip such steps")
        if bad:
            skipped_steps += len(bad)
            for s, loss, norm in bad:
                writer.write("skipped", s, {"loss": loss, "grad_norm": norm,
                                            "skipped_total": skipped_steps})
            bar.message(f"skipped {len(bad)} non-finite step(s) (first: step {bad[0][0]}); "
                        f"{skipped_steps} in this run")
        broken = [name for key, name in (("params", "parameters"),
                                         ("opt_state", "optimizer state")) if not parts_ok[key]]
        if broken:
            steps = f"the update at step {step}" if since == step else \
                f"an update at steps {since}-{step}"
            raise DivergenceError(
                f"training diverged: non-finite {' and '.join(broken)} after {steps} (an "
                f"overflow by an update whose loss and gradient norm were finite; "
                f"train.on_nonfinite=skip cannot undo an applied update); {saved}. "
                "Lower optim.lr")

    def save(force: bool) -> bool:
        check_finite()
        log.flush(step)     # every record up to the checkpoint's step is on disk first
        return checkpointer.save(step, state=state, data_iterator=train_iterator,
                                 config=config.to_dict(), extra=extra,
                                 progress={"skipped_steps": skipped_steps}, force=force)

    def run_eval() -> dict[str, Any]:
        result = evaluate(session, state["params"], iter(eval_dataset), t.eval_batches)
        writer.write("eval", step, result)
        bar.message(f"eval step {step}: loss {result['loss']:.4f}")
        return result

    try:
        with install_preemption_handler() as stop, mesh_context(session.mesh):
            while step < t.steps:
                batch = to_global(session, next(train_iterator))
                if step == start_step:
                    state, metrics = _first_step(session, state, batch, bar, log)
                else:
                    state, metrics = session.train_step(state, batch)
                step += 1
                log.add(metrics)
                unchecked.append((step, metrics))
                if step % t.log_every == 0 or step == t.steps:
                    check_finite()
                    log.flush(step)
                eval_due = bool(t.eval_every) and step % t.eval_every == 0 and step < t.steps
                if eval_due or checkpointer.should_save(step):
                    jax.block_until_ready(metrics)
                    check_finite()
                    log.flush(step)
                    with log.paused():
                        if eval_due:
                            last_eval = run_eval()
                            eval_loss, eval_step = last_eval["loss"], step
                        save(force=False)
                if _stop_everywhere(stop, step, t.log_every) or checkpointer.reached_preemption(step):
                    preempted = True
                    log.flush(step)
                    bar.message(f"stop requested ({stop.signal_name or 'preemption'}): "
                                f"saving step {step}")
                    break
            if not preempted:
                last_eval = run_eval()
                eval_loss, eval_step = last_eval["loss"], step
            save(force=True)
            checkpointer.wait_until_finished()
    except Exception as error:
        _raise_out_of_memory(error, config)
        raise
    finally:
        bar.close()
        writer.close()
        checkpointer.close()
    return FitResult(run_dir=run_dir, params=count_params(session.abstract_state["params"]),
                     steps=step, start_step=start_step, train_loss=log.train_loss,
                     eval_loss=eval_loss, eval_step=eval_step,
                     tokens_per_second=log.tokens_per_second(),
                     checkpoint_dir=checkpointer.directory,
                     latest_checkpoint=checkpointer.latest_step(),
                     wall_seconds=time.time() - started, preempted=preempted, eval=last_eval,
                     skipped_steps=skipped_steps)


def _raise_out_of_memory(error: Exception, config: Config) -> None:
    """XLA's out-of-memory as a one-line DeviceMemoryError (train/core/memory.py)."""
    memory_error = out_of_memory_error(error, config)
    if memory_error is not None:
        raise memory_error from error


def _check_data_order(config: Config, run_dir: Path) -> None:
    """A resumed run keeps the data.shuffle mode its checkpoints' iterator state was saved in
    (config.json of runs before the option existed: "window")."""
    config_path = run_dir / CONFIG_FILENAME
    if not config_path.is_file():
        return
    saved = load_run_config(run_dir).get("data", {}).get("shuffle", "window")
    if saved != config.data.shuffle and checkpoint_steps(run_dir):
        raise RunSetupError(
            f"data.shuffle={config.data.shuffle!r} differs from this run's data.shuffle="
            f"{saved!r} ({config_path}): its data iterator state cannot be restored in the "
            f"other mode; resume with data.shuffle={saved} --run-dir {run_dir}, or start "
            f"another run (--new)")


def _startup_report(config: Config, session: Session, run_dir: Path, bar: ProgressBar,
                    estimate: MemoryEstimate, limit: int | None, cache_line: str) -> None:
    """Devices, mesh, size, tokens per step, run dir, compile cache and the memory estimate
    (before the train step compiles)."""
    devices = jax.devices()
    mesh = dict(session.mesh.shape)
    d, t = config.data, config.train
    params = count_params(session.abstract_state["params"])
    micro = (f" in {t.grad_accum} micro-batches of {d.batch_size // t.grad_accum}"
             if t.grad_accum > 1 else "")
    bar.message(f"devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}), "
                f"{jax.process_count()} process(es); mesh data={mesh['data']} "
                f"fsdp={mesh['fsdp']} tensor={mesh['tensor']}"
                + (f" context={mesh['context']}" if "context" in mesh else ""))
    bar.message(f"model: {params / 1e6:.3f}M parameters; tokens/step: {d.batch_size} x "
                f"{d.seq_len} = {d.batch_size * d.seq_len}{micro}")
    bar.message(f"memory estimate: {estimate.describe()}"
                + describe_limit(limit))
    bar.message(f"run dir: {run_dir}")
    bar.message(cache_line)


def _first_step(session: Session, state, batch, bar: ProgressBar, log: "_StepLog"):
    """The first step of this process: compiles; its time stays out of the ETA and tokens/s."""
    bar.message("compiling the train step...")
    started = time.time()
    with log.paused():
        state, metrics = session.train_step(state, batch)
        jax.block_until_ready(metrics)
    bar.message(f"compiled; first step done in {format_duration(time.time() - started)}")
    return state, metrics


class _StepLog:
    """Train metrics between log points -> JSONL/TensorBoard records, progress bar, tokens/s.

    Time spent in `paused()` (evaluation, checkpoints) and the first window after a (re)start
    (compilation) stay out of the tokens/s figures.
    """

    def __init__(self, writer: MetricsWriter, bar: ProgressBar, total_steps: int,
                 tokens_per_step: int, start_step: int):
        self.writer, self.bar = writer, bar
        self.total_steps, self.tokens_per_step, self.start_step = total_steps, tokens_per_step, start_step
        self.window: list[dict[str, jax.Array]] = []
        self.window_started = time.time()
        self.timed_steps, self.timed_seconds = 0, 0.0
        self.train_loss: float | None = None

    def add(self, metrics: dict[str, jax.Array]) -> None:
        self.window.append(metrics)

    @contextlib.contextmanager
    def paused(self):
        paused_at = time.time()
        yield
        self.window_started += time.time() - paused_at

    def flush(self, step: int) -> None:
        if not self.window:
            return
        values = jax.device_get(self.window)
        elapsed = max(time.time() - self.window_started, 1e-9)
        if step - len(values) > self.start_step:
            self.timed_steps += len(values)
            self.timed_seconds += elapsed
        rate = self.tokens_per_step * len(values) / elapsed
        self.train_loss = float(np.mean([v["loss"] for v in values]))
        for offset, v in enumerate(values):
            self.writer.write("train", step - len(values) + 1 + offset,
                              {name: float(x) for name, x in v.items()})
        self.writer.write("throughput", step, {"tokens_per_second": rate})
        eta = (self.total_steps - step) * elapsed / len(values)
        self.bar.update(step, self.train_loss, rate, eta)
        self.window, self.window_started = [], time.time()

    def tokens_per_second(self) -> float:
        if not self.timed_seconds:
            return float("nan")
        return self.tokens_per_step * self.timed_steps / self.timed_seconds


def _stop_everywhere(stop: PreemptionFlag, step: int, every: int) -> bool:
    """A stop requested on any process stops every process (at the same step).

    One process: checked every step (a host flag, no device sync). Several processes: the
    flags are gathered only every `every` steps, so the hot loop holds no per-step collective.
    """
    if jax.process_count() == 1:
        return bool(stop)
    if step % every:
        return False
    return bool(np.any(multihost_utils.process_allgather(np.asarray(bool(stop)))))
