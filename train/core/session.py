"""A session: everything compiled for one config on one mesh, and the data streams it reads.

    model, optimizer, schedule     from the config (train/core/model.py, train/core/optimizer.py)
    state                          {"step", "params", "opt_state"} (train/core/step.py), sharded by
                                   the logical rules (train/core/sharding.py); abstract_state holds
                                   its ShapeDtypeStructs with shardings, for restoring
    train_step, eval_step          train/core/step.py, jitted with those shardings (the train
                                   state is donated); a step whose loss or gradient norm is
                                   not finite keeps params and opt_state as they were (only
                                   "step" advances) and reports metrics["nonfinite"] = 1
                                   (guard_nonfinite); train.grad_accum micro-batches per step
                                   (train/core/step.py)
    init_state                     the initial state for train.seed, drawn on the host's CPU and
                                   put onto the state's shardings (train.init_on="host",
                                   host_init), or by the same program jitted onto the devices
                                   ("device")
    state_finite                   state -> {"params", "opt_state"}: bool [] each (all_finite,
                                   jitted): the exact check that train/core/fit.py runs at
                                   each log point and before every checkpoint save
    checked mode                   train.check_ranges: the train step runs under checkify
                                   with the ops' range checks traced in (mixer_core.ranges
                                   checked_ranges); a violated range raises RangeCheckError
    data streams                   train: the training documents, rows shuffled as
                                   data.shuffle says; eval: held-out documents in a fixed
                                   shuffled order; batch_size / process per process

Checkpoints written before the per-step "rng" was dropped from the state still restore:
RETIRED_STATE_KEYS are read and discarded (`Checkpointer.restore(ignore_saved=...)`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from mixer_core.ranges import checked_ranges
from train.core.config import Config
from train.core.model import LanguageModel, build_model
from train.core.optimizer import build_optimizer, learning_rate_schedule
from train.core.sharding import (batch_sharding, global_batch, logical_shardings, make_mesh,
                                 replicated, state_shardings)
from train.core.step import State, make_eval_step, make_train_step
from train.core.validation import validate_for_devices
from train.data.pipeline import make_dataset
from train.data.tokenizer import Tokenizer

RETIRED_STATE_KEYS = ("rng",)   # a per-step PRNG key, split and saved but never used


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
    init_fn: Callable[[int], State]  # seed -> state, unjitted (benchmarks/init_compile_time.py)
    init_jit: Callable[[int], State]  # init_fn jitted onto the state's shardings, seed static
    state_finite: Callable[[State], dict[str, jax.Array]]  # {"params", "opt_state"}: bool []


def guard_nonfinite(train_step: Callable[[State, dict], tuple[State, dict]]):
    """train_step whose update is dropped when its loss or gradient norm is not finite:
    ok = isfinite(loss) & isfinite(grad_norm); new params/opt_state = where(ok, updated,
    previous), leaf by leaf; metrics gain "nonfinite" = not ok (0./1.).

    ok is two scalars known before the optimizer update, so XLA fuses each leaf's select into
    the elementwise kernel that computes that leaf's update: no extra pass over the parameters
    and optimizer state (a predicate that read the updated parameters could not fuse). The
    wrapper and the step trace into one jitted program: what the predicate depends on decides
    the fusion, not where the select is written.

    The updated parameters are not checked here, and need not be per step: a finite gradient
    norm means every g^2 is finite, and from finite gradients the project's optimizers
    (train/core/optimizer.py: global-norm clipping, then AdamW / Muon / SGD per group under
    multi_transform, the alpha group's learning rate a scaled schedule) make finite updates:
    moments are convex combinations of finite values, Adam divides by sqrt(v) + eps and Muon
    by a norm + eps with eps > 0, the learning rates and weight decay are finite. Parameters
    (and moments) can then only become non-finite by overflowing, which needs values near the
    float32 maximum (3.4e38). That is still possible in principle, so nothing non-finite is
    ever checkpointed: train/core/fit.py checks the parameters and optimizer state exactly
    (all_finite) at each log point and before every save, and stops the run when they are
    not finite."""

    def guarded(state, batch):
        new_state, metrics = train_step(state, batch)
        ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        kept = jax.tree.map(lambda new, old: jnp.where(ok, new, old),
                            {k: new_state[k] for k in ("params", "opt_state")},
                            {k: state[k] for k in ("params", "opt_state")})
        return ({**new_state, **kept},
                {**metrics, "nonfinite": jnp.logical_not(ok).astype(jnp.float32)})

    return guarded


def all_finite(tree: Any) -> jax.Array:
    """bool []: every element of every floating leaf of `tree` is finite (exact: no sampling;
    integer leaves are always finite)."""
    checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.bool_(True)


def finite_parts(state: State) -> dict[str, jax.Array]:
    """{"params", "opt_state"}: bool [] each, all_finite of that part of the train state."""
    return {k: all_finite(state[k]) for k in ("params", "opt_state")}


class RangeCheckError(ValueError):
    """train.check_ranges: an op argument left its valid range inside the train step."""


def checked_train_step(train_step: Callable[[State, dict], tuple[State, dict]]):
    """train_step under checkify with the ops' range checks traced in: (err, (state,
    metrics)). `raise_range_errors` turns err into a RangeCheckError."""
    from jax.experimental import checkify

    def traced_with_checks(state, batch):
        with checked_ranges():
            return train_step(state, batch)

    return checkify.checkify(traced_with_checks, errors=checkify.user_checks)


def raise_range_errors(checked_step):
    """(err, out) -> out, raising RangeCheckError when a range check failed (a host sync)."""

    def step(state, batch):
        error, out = checked_step(state, batch)
        message = error.get()
        if message is not None:
            raise RangeCheckError(f"train.check_ranges: {message.splitlines()[0]}")
        return out

    return step


def default_mesh(config: Config) -> Mesh:
    return make_mesh(validate_for_devices(config, jax.device_count()))


def build_session(config: Config, vocab_size: int, mesh: Mesh | None = None) -> Session:
    """Model, optimizer, shardings and jitted step functions for `config` on `mesh`."""
    mesh = default_mesh(config) if mesh is None else mesh
    model = build_model(config, vocab_size)
    optimizer = build_optimizer(config.optim, config.train.steps)
    schedule = learning_rate_schedule(config.optim, config.train.steps)
    # a length that splits over mesh.context (the init traces the context-parallel mixers)
    dummy = jnp.zeros((1, min(config.data.seq_len, 16 * config.mesh.context)), jnp.int32)

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
    }

    def init_fn(seed):
        # the first half of a split, as before the rng was dropped: a seed keeps its params
        params_key = jax.random.split(jax.random.PRNGKey(seed))[0]
        params = nn.meta.unbox(init_boxed(params_key))
        return {"step": jnp.zeros((), jnp.int32), "params": params,
                "opt_state": optimizer.init(params)}

    abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(init_fn, 0), shardings)
    jitted_init = jax.jit(init_fn, static_argnums=0, out_shardings=shardings)

    data_sharding = batch_sharding(mesh)
    batch_shardings = {"tokens": data_sharding, "segment_ids": data_sharding}
    step_fn = guard_nonfinite(make_train_step(model, optimizer, schedule,
                                              config.train.grad_accum))
    if config.train.check_ranges:
        train_step = raise_range_errors(jax.jit(
            checked_train_step(step_fn), in_shardings=(shardings, batch_shardings),
            out_shardings=(None, (shardings, replicated(mesh))), donate_argnums=(0,)))
    else:
        train_step = jax.jit(step_fn, in_shardings=(shardings, batch_shardings),
                             out_shardings=(shardings, replicated(mesh)), donate_argnums=(0,))
    eval_step = jax.jit(
        make_eval_step(model, config.data.seq_len, config.train.position_buckets),
        in_shardings=(shardings["params"], batch_shardings), out_shardings=replicated(mesh))
    return Session(config=config, mesh=mesh, model=model, optimizer=optimizer, schedule=schedule,
                   state_shardings=shardings, abstract_state=abstract_state,
                   batch_sharding=data_sharding, train_step=train_step, eval_step=eval_step,
                   init_state=(functools.partial(host_init, jax.jit(init_fn, static_argnums=0),
                                                 config.train.seed, shardings)
                               if config.train.init_on == "host"
                               else lambda: jitted_init(config.train.seed)),
                   init_fn=init_fn, init_jit=jitted_init,
                   state_finite=jax.jit(finite_parts, in_shardings=(shardings,),
                                        out_shardings=replicated(mesh)))


def host_init(unsharded_init: Callable[[int], State], seed: int, shardings: State) -> State:
    """unsharded_init(seed) (the init jitted without shardings) compiled and run on the host's CPU,
    each leaf then placed on its sharding (every process draws the same state and supplies its
    own shards). The program is tens of thousands of elementwise instructions (each
    initializer's threefry and sampler): the GPU compiler took 51 s over it for fpa_125m on an
    H200 machine, the CPU compiler 6 s (benchmarks/init_compile_time.py); the values agree
    within float32 rounding. It steps out of the caller's mesh: under `jax.set_mesh` a jitted
    program without committed inputs is placed on the mesh's devices, whatever the default
    device says (the model's init traces the same without a mesh: one device, no context axis)."""
    with jax.set_mesh(None), jax.default_device(jax.local_devices(backend="cpu")[0]):
        state = jax.device_get(unsharded_init(seed))
    return jax.tree.map(
        lambda x, sharding: jax.make_array_from_callback(np.shape(x), sharding,
                                                         lambda index: np.asarray(x)[index]),
        state, shardings)


def to_global(session: Session, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    return global_batch(local_batch, session.batch_sharding)


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
                        max_documents=d.max_documents or None, shuffle=True,
                        shuffle_mode=d.shuffle if split == "train" else "window",
                        shuffle_window=d.shuffle_window)
