"""Probe runner: train many seeds of a small model at once (vmap over seeds), per method.

    per seed s:  data  = task(seed=2s) for training, task(seed=2s+1) held out   [N, T] each
                 init  = ProbeModel.init(PRNGKey(s)),  minibatches drawn from PRNGKey(s)
                 steps of AdamW (warm-up + cosine), masked cross-entropy on scored positions
                 every eval_every steps: held-out accuracy = mean over scored positions of
                 [argmax logits == target]
    train_seeds: jit(vmap(train_one)) over the seeds -- one compile, all seeds at once
    success(s)  = final held-out accuracy > TASKS[task].threshold

run_probe trains every method, counts successes, and compares the reference method (FPA by
default) with each other method by the one-sided Fisher exact test (stats.fisher_greater).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from train.probes.model import build_model, check_method
from train.probes.stats import fisher_greater, sign_test_greater
from train.probes.tasks import PAD, TASKS, ProbeData, resolve_sizes


@dataclass(frozen=True)
class ProbeConfig:
    seeds: int = 15
    first_seed: int = 0
    steps: int = 2000
    eval_every: int = 100
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.0
    model_dim: int = 32
    num_layers: int = 1
    num_heads: int = 1
    head_dim: int = 4
    mlp: bool = True
    token_shift: bool = False   # a learned previous-token mix before each attention (model.py)
    bos: bool = False           # every sequence starts with a BOS token (id vocab_size of the task)
    train_size: int = 2048
    test_size: int = 512

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"ProbeConfig: {field.name} must be an int, got {value!r}")
        positive = ("seeds", "steps", "eval_every", "batch_size", "model_dim", "num_layers",
                    "num_heads", "head_dim", "train_size", "test_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"ProbeConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.steps % self.eval_every:
            raise ValueError(f"ProbeConfig: steps ({self.steps}) must be a multiple of "
                             f"eval_every ({self.eval_every})")
        if not self.lr > 0:
            raise ValueError(f"ProbeConfig: lr must be > 0, got {self.lr}")


def seed_data(task: str, seeds: list[int], sizes: dict, config: ProbeConfig):
    """Stacked (train, test) ProbeData over seeds, padded to one length: [S, N, T] arrays."""
    generate = TASKS[task].generate
    splits = [[generate(2 * s, config.train_size, **sizes) for s in seeds],
              [generate(2 * s + 1, config.test_size, **sizes) for s in seeds]]
    length = max(d.tokens.shape[1] for split in splits for d in split)

    def pad(a):
        return np.pad(a, ((0, 0), (0, length - a.shape[1])))

    stacked = [ProbeData(*(np.stack([pad(getattr(d, f)) for d in split])
                           for f in ("tokens", "targets", "mask")), split[0].vocab_size)
               for split in splits]
    return [with_bos(d) for d in stacked] if config.bos else stacked


def with_bos(data: ProbeData) -> ProbeData:
    """Prepends a BOS token (a new id, vocab_size) to every sequence: unscored, target PAD.

    Selective Attention never masks a document's first token (the BOS role); without a BOS
    that token is a task token, which its mask can then never remove."""
    def prepend(a, value):
        return np.concatenate([np.full(a.shape[:-1] + (1,), value, a.dtype), a], axis=-1)

    return ProbeData(prepend(data.tokens, data.vocab_size), prepend(data.targets, PAD),
                     prepend(data.mask, False), data.vocab_size + 1)


@functools.lru_cache(maxsize=16)
def _compiled_trainer(method: str, vocab_size: int, config: ProbeConfig):
    """One jitted trainer per (method, vocab, config without the seed fields): reruns with other
    seeds of the same shapes reuse its compilation."""
    model = build_model(method, vocab_size, model_dim=config.model_dim,
                        num_layers=config.num_layers, num_heads=config.num_heads,
                        head_dim=config.head_dim, mlp=config.mlp,
                        token_shift=config.token_shift)
    return _train_function(model, config)


def _train_function(model: nn.Module, config: ProbeConfig):
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.lr, min(config.warmup_steps, config.steps // 2 + 1) or 1, config.steps)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(schedule, weight_decay=config.weight_decay))
    num_evals = config.steps // config.eval_every

    def loss_fn(params, tokens, targets, mask):
        logits = model.apply({"params": params}, tokens)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1)

    def scored_hits(params, tokens, targets, mask):
        return (jnp.argmax(model.apply({"params": params}, tokens), axis=-1) == targets) * mask

    def accuracy(params, tokens, targets, mask):
        return jnp.sum(scored_hits(params, tokens, targets, mask)) / jnp.maximum(jnp.sum(mask), 1)

    def accuracy_by_position(params, tokens, targets, mask):
        """[T]: held-out accuracy at each position over the sequences scored there (NaN where
        none is)."""
        hits = scored_hits(params, tokens, targets, mask)
        scored = jnp.sum(mask, axis=0)
        return jnp.where(scored > 0, jnp.sum(hits, axis=0) / jnp.maximum(scored, 1), jnp.nan)

    def train_one(key, train, test):
        init_key, batch_key = jax.random.split(key)
        params = nn.unbox(model.init(init_key, train[0][:1]))["params"]
        state = (params, optimizer.init(params))

        def step(state, step_key):
            params, opt_state = state
            index = jax.random.randint(step_key, (config.batch_size,), 0, train[0].shape[0])
            loss, grads = jax.value_and_grad(loss_fn)(params, *(a[index] for a in train))
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        def chunk(state, chunk_key):
            state, losses = jax.lax.scan(step, state, jax.random.split(chunk_key, config.eval_every))
            return state, (jnp.mean(losses), accuracy(state[0], *test))

        state, (losses, accuracies) = jax.lax.scan(chunk, state,
                                                   jax.random.split(batch_key, num_evals))
        return losses, accuracies, accuracy_by_position(state[0], *test)

    return jax.jit(jax.vmap(train_one))


def train_seeds(method: str, task: str, sizes: dict, config: ProbeConfig) -> dict:
    """Trains config.seeds seeds of `method` on `task` in one vmapped program.

    Returns {"loss": [S, E] mean train loss per chunk, "accuracy": [S, E] held-out accuracy
    after each chunk (E = steps / eval_every), "accuracy_by_position": [S, T] the final
    held-out accuracy at each position (NaN where nothing is scored), "seeds": [S],
    "seconds": wall time incl. compile}.
    """
    check_method(method)
    seeds = list(range(config.first_seed, config.first_seed + config.seeds))
    train, test = seed_data(task, seeds, sizes, config)
    trainer = _compiled_trainer(method, train.vocab_size,
                                dataclasses.replace(config, seeds=1, first_seed=0))
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
    start = time.perf_counter()
    losses, accuracies, by_position = trainer(keys, tuple(train[:3]), tuple(test[:3]))
    return {"seeds": seeds, "loss": np.asarray(losses), "accuracy": np.asarray(accuracies),
            "accuracy_by_position": np.asarray(by_position),
            "seconds": time.perf_counter() - start}


def run_probe(task: str, methods: list[str], config: ProbeConfig, sizes: dict | None = None,
              reference: str = "fpa", progress: Callable[[str], None] | None = None,
              after_method: Callable[[dict], None] | None = None) -> dict:
    """Every method on `task`; successes, Fisher p-values of `reference` vs each other method.

    Returns a JSON-ready dict: task, sizes, threshold, config, and per method successes,
    seeds, final accuracies (overall and by position), curves and wall seconds; "fisher" and "sign_test" map method ->
    one-sided p-value of the reference against it (Fisher; sign test paired by seed).
    progress(line): called before and after each method (its seeds train at once).
    after_method(result): called after each method with the result of the methods so far (the
    CLI writes it, so a run stopped midway keeps the methods it finished).
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
    if not methods:
        raise ValueError("methods must name at least one method")
    for method in methods:
        check_method(method)
    sizes = resolve_sizes(task, sizes)
    threshold = TASKS[task].threshold
    report = progress or (lambda line: None)
    results = {}
    for index, method in enumerate(methods, start=1):
        report(f"probe {task} {index}/{len(methods)}: training {method} on {config.seeds} "
               f"seeds at once ({config.first_seed}..{config.first_seed + config.seeds - 1}), "
               f"{config.steps} steps...")
        run = train_seeds(method, task, sizes, config)
        final = run["accuracy"][:, -1]
        successes = int(np.sum(final > threshold))
        report(f"probe {task} {index}/{len(methods)}: {method}: "
               f"{successes}/{config.seeds} seeds above {threshold} "
               f"(mean final accuracy {float(np.mean(final)):.3f}) | {run['seconds']:.1f} s")
        results[method] = {
            "successes": successes,
            "seeds": config.seeds,
            "final_accuracy": [float(a) for a in final],
            "accuracy_curves": run["accuracy"].tolist(),
            "loss_curves": run["loss"].tolist(),
            "seconds": run["seconds"],
        }
        if run.get("accuracy_by_position") is not None:   # [S][T], null where none is scored
            results[method]["final_accuracy_by_position"] = [
                [None if np.isnan(a) else float(a) for a in row]
                for row in run["accuracy_by_position"]]
        if after_method is not None and index < len(methods):
            after_method(_summary(task, sizes, threshold, reference, config, results))
    return _summary(task, sizes, threshold, reference, config, results)


def _summary(task, sizes, threshold, reference, config, results) -> dict:
    """run_probe's result for the methods in `results`: the p-values of `reference` against
    each other one, when it ran."""
    fisher, sign = {}, {}
    if reference in results:
        ref = results[reference]
        succeeded = lambda run: [a > threshold for a in run["final_accuracy"]]
        for m, r in results.items():
            if m != reference:
                fisher[m] = fisher_greater(ref["successes"], ref["seeds"], r["successes"],
                                           r["seeds"])
                sign[m] = sign_test_greater(succeeded(ref), succeeded(r))
    return {"task": task, "sizes": sizes, "threshold": threshold, "reference": reference,
            "config": dataclasses.asdict(config), "steps_axis":
            [config.eval_every * (i + 1) for i in range(config.steps // config.eval_every)],
            "methods": dict(results), "fisher": fisher, "sign_test": sign}
