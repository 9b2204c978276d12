"""Step functions and the training loop (fit), evaluation, and SpectralShift continued pretraining.

    batch       {"tokens", "segment_ids"} int32 [B, L+1]  ->  inputs/targets/segment_ids/loss_mask [B, L]
    loss        sum_{b,j} mask_bj * CE(logits_bj, target_bj) / max(1, sum mask)      (float32)
    train step  grads = d loss / d params;  updates, opt_state = tx(grads, opt_state, params);
                params += updates;  step += 1;  rng <- split(rng)[0]
    eval step   per-position loss: bucket_j = min(p_j // ceil(L / nb), nb - 1) with p_j the
                position of input j inside its document (0 at each document start), i.e.
                the prediction made with p_j + 1 tokens of context
    state       {"step": int32 [], "params", "opt_state", "rng": uint32 [2]}, sharded by the
                logical rules (train/sharding.py); checkpointed with the data-iterator state

The loop saves every `train.checkpoint_every` steps (async), saves and stops on SIGTERM/SIGINT,
and resumes from the newest readable checkpoint of the run directory: params, optimizer state,
step, RNG and the grain iterator, so a resumed run continues the same loss trajectory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from gdn_jax.spectral_shift import spectral_shift, spectralshift_scale
from train import checkpoint as ckpt
from train.config import Config, config_from_dict, validate_for_devices
from train.data import make_dataset, split_inputs_and_targets
from train.metrics import MetricsWriter, ProgressBar
from train.model import LanguageModel, build_model, count_params, positions_within_documents
from train.optimizer import build_optimizer, learning_rate_schedule
from train.sharding import (batch_sharding, global_batch, logical_shardings, make_mesh,
                            mesh_context, replicated, state_shardings)
from train.tokenizer import Tokenizer, load_tokenizer

CHECKPOINT_DIRNAME = "checkpoints"
State = dict[str, Any]


# ----------------------------------------------------------------------------- session


@dataclasses.dataclass
class Session:
    """Everything compiled for one config on one mesh."""

    config: Config
    mesh: Mesh
    model: LanguageModel
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule
    state_shardings: State
    abstract_state: State           # ShapeDtypeStructs with shardings (for restore)
    batch_sharding: NamedSharding
    train_step: Callable[[State, dict], tuple[State, dict]]
    eval_step: Callable[[dict, dict], dict]
    init_state: Callable[[], State]


def default_mesh(config: Config) -> Mesh:
    return make_mesh(validate_for_devices(config, jax.device_count()))


def build_session(config: Config, vocab_size: int, mesh: Mesh | None = None) -> Session:
    """Model, optimizer, shardings and jitted step functions for `config` on `mesh`."""
    mesh = default_mesh(config) if mesh is None else mesh
    model = build_model(config, vocab_size)
    optimizer = build_optimizer(config.optim, config.train.steps)
    schedule = learning_rate_schedule(config.optim, config.train.steps)
    init_length = min(config.data.seq_len, 16)
    dummy = jnp.zeros((1, init_length), jnp.int32)

    def init_boxed(key):
        return model.init(key, dummy, jnp.ones_like(dummy))["params"]

    boxed = jax.eval_shape(init_boxed, jax.random.PRNGKey(0))
    param_shardings = logical_shardings(boxed, mesh)
    abstract_params = nn.meta.unbox(boxed)
    abstract_opt_state = jax.eval_shape(optimizer.init, abstract_params)
    shardings = {
        "step": replicated(mesh),
        "params": param_shardings,
        "opt_state": state_shardings(abstract_opt_state, abstract_params, param_shardings, mesh),
        "rng": replicated(mesh),
    }

    def init_fn(seed):
        params_key, state_key = jax.random.split(jax.random.PRNGKey(seed))
        params = nn.meta.unbox(init_boxed(params_key))
        return {"step": jnp.zeros((), jnp.int32), "params": params,
                "opt_state": optimizer.init(params), "rng": state_key}

    abstract_state = jax.eval_shape(init_fn, 0)
    abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings)
    jitted_init = jax.jit(init_fn, static_argnums=0, out_shardings=shardings)

    def loss_and_metrics(params, batch):
        view = split_inputs_and_targets(batch)
        logits = model.apply({"params": params}, view["inputs"], view["segment_ids"])
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, view["targets"])
        mask = view["loss_mask"].astype(jnp.float32)
        count = jnp.sum(mask)
        loss = jnp.sum(losses * mask) / jnp.maximum(count, 1.0)
        return loss, (losses, mask, view["segment_ids"])

    def train_step(state, batch):
        grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)
        (loss, (_, mask, _)), grads = grad_fn(state["params"], batch)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state,
                     "rng": jax.random.split(state["rng"])[0]}
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
                   "lr": schedule(state["step"]), "target_tokens": jnp.sum(mask)}
        return new_state, metrics

    buckets = config.train.position_buckets
    bucket_width = -(-config.data.seq_len // buckets)

    def eval_step(params, batch):
        loss, (losses, mask, segment_ids) = loss_and_metrics(params, batch)
        bucket = jnp.minimum(positions_within_documents(segment_ids) // bucket_width, buckets - 1)
        per_bucket_loss = jnp.zeros(buckets, jnp.float32).at[bucket].add(losses * mask)
        per_bucket_count = jnp.zeros(buckets, jnp.float32).at[bucket].add(mask)
        return {"loss_sum": jnp.sum(losses * mask), "count": jnp.sum(mask),
                "bucket_loss_sum": per_bucket_loss, "bucket_count": per_bucket_count}

    data_sharding = batch_sharding(mesh)
    batch_shardings = {"tokens": data_sharding, "segment_ids": data_sharding}
    jitted_train = jax.jit(train_step, in_shardings=(shardings, batch_shardings),
                           out_shardings=(shardings, replicated(mesh)), donate_argnums=(0,))
    jitted_eval = jax.jit(eval_step, in_shardings=(shardings["params"], batch_shardings),
                          out_shardings=replicated(mesh))
    return Session(config=config, mesh=mesh, model=model, optimizer=optimizer, schedule=schedule,
                   state_shardings=shardings, abstract_state=abstract_state,
                   batch_sharding=data_sharding, train_step=jitted_train, eval_step=jitted_eval,
                   init_state=lambda: jitted_init(config.train.seed))


def to_global(session: Session, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    return global_batch(local_batch, session.batch_sharding)


# ----------------------------------------------------------------------------- data


def local_batch_size(config: Config) -> int:
    if config.data.batch_size % jax.process_count():
        raise ValueError(f"data.batch_size={config.data.batch_size} must be divisible by the "
                         f"{jax.process_count()} processes")
    return config.data.batch_size // jax.process_count()


def make_split_dataset(config: Config, tokenizer: Tokenizer, split: str):
    """The train stream, or the eval stream: held-out documents in a fixed shuffled order (so
    the first eval batches sample many documents, not the first few in sorted order)."""
    d = config.data
    return make_dataset(source=d.source, tokenizer=tokenizer, seq_len=d.seq_len,
                        batch_size=local_batch_size(config), split=split, seed=d.seed,
                        heldout_fraction=d.heldout_fraction, process_index=jax.process_index(),
                        process_count=jax.process_count(),
                        max_documents=d.max_documents or None, shuffle=True)


# ----------------------------------------------------------------------------- evaluation


def evaluate(session: Session, params: Any, batches: Iterator[dict[str, np.ndarray]],
             num_batches: int) -> dict[str, Any]:
    """Mean held-out loss over `num_batches` batches and the per-position-bucket mean loss."""
    totals = None
    with mesh_context(session.mesh):
        for _ in range(num_batches):
            out = session.eval_step(params, to_global(session, next(batches)))
            totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    totals = jax.device_get(totals)
    width = -(-session.config.data.seq_len // session.config.train.position_buckets)
    counts = totals["bucket_count"]
    per_position = [float(s / c) if c > 0 else None
                    for s, c in zip(totals["bucket_loss_sum"], counts)]
    return {
        "loss": float(totals["loss_sum"] / max(totals["count"], 1.0)),
        "tokens": int(totals["count"]),
        "position_bucket_start": [i * width for i in range(len(counts))],
        "position_loss": per_position,
        "position_tokens": [int(c) for c in counts],
    }


# ----------------------------------------------------------------------------- fit


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


def fit(config: Config, run_dir: str | Path, *,
        initial_params: Callable[[Session], Any] | None = None,
        spectral_shift_marker: dict[str, Any] | None = None,
        inherited_markers: list[dict[str, Any]] = (),
        mesh: Mesh | None = None) -> FitResult:
    """Train `config` in `run_dir`, resuming from its newest checkpoint if there is one.

    initial_params(session) -> params replaces the random init of a fresh run (cpt).
    spectral_shift_marker: the SpectralShift this run applies; a resumed run must find it in
    its checkpoint record (and then does not apply it again).
    """
    started = time.time()
    run_dir = Path(run_dir)
    tokenizer = load_tokenizer(config.data.tokenizer)
    session = build_session(config, tokenizer.vocab_size, mesh)
    ckpt.save_run_files(run_dir, config=config.to_dict(), tokenizer=tokenizer)
    t = config.train
    checkpointer = ckpt.Checkpointer(
        run_dir / CHECKPOINT_DIRNAME, max_to_keep=t.keep_checkpoints,
        save_interval_steps=t.checkpoint_every or (t.steps + 1))
    train_iterator = iter(make_split_dataset(config, tokenizer, "train"))
    eval_dataset = make_split_dataset(config, tokenizer, "eval")
    writer = MetricsWriter(run_dir, tensorboard=t.tensorboard)
    bar = ProgressBar(t.steps)

    restored = checkpointer.restore_latest(session.abstract_state, data_iterator=train_iterator)
    if restored is not None:
        state, start_step = restored.state, restored.step
        markers = list(restored.record.get("spectral_shift_applied", []))
        if spectral_shift_marker is not None and not any(
                _same_stage(m, spectral_shift_marker) for m in markers):
            raise ValueError(
                f"{run_dir}: its checkpoint (step {start_step}) has no record of the SpectralShift "
                f"this run applies ({spectral_shift_marker}); use a fresh run directory")
        bar.message(f"resumed from step {start_step} ({checkpointer.directory})")
    else:
        state, start_step = session.init_state(), 0
        if initial_params is not None:
            state["params"] = jax.device_put(initial_params(session),
                                             session.state_shardings["params"])
        markers = list(inherited_markers)
        if spectral_shift_marker is not None:
            markers.append(spectral_shift_marker)

    step = start_step
    log = _StepLog(writer, bar, t.steps, config.data.batch_size * config.data.seq_len, start_step)
    eval_loss = eval_step = None
    last_eval: dict[str, Any] | None = None
    preempted = False

    def save(force: bool) -> bool:
        return checkpointer.save(step, state=state, data_iterator=train_iterator,
                                 config=config.to_dict(), spectral_shift_applied=markers,
                                 force=force)

    def run_eval() -> dict[str, Any]:
        result = evaluate(session, state["params"], iter(eval_dataset), t.eval_batches)
        writer.write("eval", step, result)
        bar.message(f"eval step {step}: loss {result['loss']:.4f}")
        return result

    try:
        with ckpt.install_preemption_handler() as stop, mesh_context(session.mesh):
            while step < t.steps:
                batch = to_global(session, next(train_iterator))
                state, metrics = session.train_step(state, batch)
                step += 1
                log.add(metrics)
                if step % t.log_every == 0 or step == t.steps:
                    log.flush(step)
                eval_due = bool(t.eval_every) and step % t.eval_every == 0 and step < t.steps
                if eval_due or checkpointer.should_save(step):
                    jax.block_until_ready(metrics)
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
                     wall_seconds=time.time() - started, preempted=preempted, eval=last_eval)


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


def _stop_everywhere(stop: ckpt.PreemptionFlag, step: int, every: int) -> bool:
    """A stop requested on any process stops every process (at the same step).

    One process: checked every step (a host flag, no device sync). Several processes: the
    flags are gathered only every `every` steps, so the hot loop holds no per-step collective.
    """
    if jax.process_count() == 1:
        return bool(stop)
    if step % every:
        return False
    return bool(np.any(multihost_utils.process_allgather(np.asarray(bool(stop)))))


def _same_stage(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("l_ref", "l_tar", "k", "mode", "reparameterize", "scale_lr")
    return all(a.get(k) == b.get(k) for k in keys)


# ----------------------------------------------------------------------------- runs on disk


def load_run(run_dir: str | Path) -> tuple[Config, Tokenizer]:
    """The config (run_dir/config.json) and tokenizer (run_dir/tokenizer) of a run."""
    run_dir = Path(run_dir)
    config = config_from_dict(ckpt.load_run_config(run_dir))
    tokenizer_dir = run_dir / ckpt.TOKENIZER_DIRNAME
    tokenizer = load_tokenizer(tokenizer_dir if tokenizer_dir.exists() else config.data.tokenizer)
    return config, tokenizer


def restore_run_state(run_dir: str | Path, session: Session,
                      step: int | None = None) -> ckpt.RestoredCheckpoint:
    """The newest (or given) checkpoint of a run, restored onto `session`'s shardings."""
    checkpointer = ckpt.Checkpointer(Path(run_dir) / CHECKPOINT_DIRNAME)
    try:
        if step is None:
            restored = checkpointer.restore_latest(session.abstract_state)
            if restored is None:
                raise FileNotFoundError(f"{run_dir}: no checkpoint in {checkpointer.directory}")
            return restored
        return checkpointer.restore(step, session.abstract_state)
    finally:
        checkpointer.close()


def evaluate_run(run_dir: str | Path, *, seq_len: int | None = None,
                 num_batches: int | None = None) -> dict[str, Any]:
    """Held-out loss of a run's newest checkpoint (optionally at another context length)."""
    config, tokenizer = load_run(run_dir)
    session = build_session(config, tokenizer.vocab_size)
    restored = restore_run_state(run_dir, session)
    if seq_len is not None:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, seq_len=seq_len))
        session = build_session(config, tokenizer.vocab_size, session.mesh)
    batches = iter(make_split_dataset(config, tokenizer, "eval"))
    result = evaluate(session, restored.state["params"], batches,
                      num_batches or config.train.eval_batches)
    return {"step": restored.step, "seq_len": config.data.seq_len, **result}


# ----------------------------------------------------------------------------- cpt


def continued_pretraining(config: Config, run_dir: str | Path) -> FitResult:
    """SpectralShift continued pretraining from `cpt.reference` (GDN.md, SpectralShift).

    s = (l_ref / l_tar) ** k applied once to the reference params' alpha projections (if
    cpt.reparameterize), alpha learning rate x s (if cpt.scale_lr); the marker in the
    checkpoint record keeps a resumed run from applying it again.
    """
    c = config.cpt
    if not c.reference:
        raise ValueError("cpt.reference: set it to the reference run directory")
    if config.optim.alpha_lr_scale != 1.0:
        raise ValueError("optim.alpha_lr_scale: cpt sets it to s; leave it at 1.0 "
                         "(use cpt.scale_lr=false to keep the alpha learning rate unscaled)")
    reference_config, reference_tokenizer = load_run(c.reference)
    tokenizer = load_tokenizer(config.data.tokenizer)
    if reference_tokenizer.fingerprint != tokenizer.fingerprint:
        raise ValueError(f"data.tokenizer: differs from the reference run's tokenizer "
                         f"({tokenizer!r} vs {reference_tokenizer!r})")
    l_ref = c.l_ref or reference_config.data.seq_len
    l_tar = c.l_tar or config.data.seq_len
    s = spectralshift_scale(l_ref, l_tar, c.k)
    if c.scale_lr:
        config = dataclasses.replace(
            config, optim=dataclasses.replace(config.optim, alpha_lr_scale=s))
    marker = {"reference": str(Path(c.reference).resolve()), "l_ref": l_ref, "l_tar": l_tar,
              "k": c.k, "mode": c.mode, "s": s, "reparameterize": c.reparameterize,
              "scale_lr": c.scale_lr}
    inherited: list[dict[str, Any]] = []

    def initial_params(session: Session) -> Any:
        reference_session = build_session(reference_config, tokenizer.vocab_size, session.mesh)
        restored = restore_run_state(c.reference, reference_session)
        inherited.extend(restored.record.get("spectral_shift_applied", []))
        marker["reference_step"] = restored.step
        params = restored.state["params"]
        _check_same_parameters(params, session.abstract_state["params"], c.reference)
        return spectral_shift(params, s=s, mode=c.mode) if c.reparameterize else params

    return fit(config, run_dir, initial_params=initial_params, spectral_shift_marker=marker,
               inherited_markers=inherited)


def _check_same_parameters(params: Any, expected: Any, reference: str) -> None:
    """The reference run's params must fit this run's model (same paths and shapes)."""
    got = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(params)}
    want = {jax.tree_util.keystr(p): x.shape
            for p, x in jax.tree_util.tree_leaves_with_path(expected)}
    if got != want:
        difference = sorted(set(got.items()) ^ set(want.items()))[:4]
        raise ValueError(f"cpt.reference: the parameters of {reference} do not fit this model "
                         f"(model/attention/gdn sections differ); first differences: {difference}")


# ----------------------------------------------------------------------------- bench


def benchmark(config: Config, *, steps: int, warmup: int = 2) -> dict[str, Any]:
    """Train-step throughput and peak memory of `config` on random tokens (one document per row).

    Needs no data: the vocabulary is model.vocab_size, else the configured tokenizer's.

    tokens/s = batch_size * seq_len * steps / seconds (after `warmup` untimed steps); peak
    memory from the device's allocator statistics where it has them (GPU), else from XLA's
    compiled memory analysis (arguments + outputs + temporaries - aliased).
    """
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

