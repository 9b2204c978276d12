"""Checks of a Config before anything starts: impossible combinations, the implementations
the layers would call, and (`validate_for_devices`) the mesh for a device count. A failure is
a ConfigError naming the dotted key.

The mixer sections are checked through the mixer table (train/core/mixers.py), without
building a model: attention.kind must name an attention spec; an attention option that
another kind owns (`MixerSpec.options`) stays at its default; each configured kind's spec
checks its own options (`check`, and `check_context` with mesh.context > 1).

Implementations: `attention.implementation` / `gdn.implementation` are checked at load
against the dispatch registry of the op each layer calls (`fpa_jax.REGISTRIES`,
`gdn_jax.REGISTRIES`; the spec names the op, `MixerSpec.op_name`), so e.g. selective
attention with "xla" is refused here, not when the model is traced.
"""

from __future__ import annotations

from fpa_jax import REGISTRIES as ATTENTION_REGISTRIES
from gdn_jax import REGISTRIES as GDN_REGISTRIES
from train.core.config import (CPT_POSITIONS, DTYPES, MIXER_LETTERS, AttentionConfig, Config,
                               ConfigError)
from train.core.config import require as _require
from train.core.mixers import (ATTENTION_KINDS, CONTEXT_PARALLEL_KINDS, MIXERS, configured_kinds,
                               layer_kinds)


def validate(config: Config) -> None:
    """Reject impossible combinations before anything starts."""
    m, a, g, d, o, mesh, t, c = (config.model, config.attention, config.gdn, config.data,
                                 config.optim, config.mesh, config.train, config.cpt)
    for key, value in [("model.d_model", m.d_model), ("model.num_layers", m.num_layers),
                       ("model.vocab_multiple", m.vocab_multiple),
                       ("attention.num_heads", a.num_heads), ("attention.head_dim", a.head_dim),
                       ("gdn.num_heads", g.num_heads), ("gdn.head_dim", g.head_dim),
                       ("gdn.conv_size", g.conv_size), ("data.seq_len", d.seq_len),
                       ("data.batch_size", d.batch_size), ("train.steps", t.steps),
                       ("train.log_every", t.log_every), ("train.eval_batches", t.eval_batches),
                       ("train.position_buckets", t.position_buckets),
                       ("train.keep_checkpoints", t.keep_checkpoints),
                       ("train.grad_accum", t.grad_accum),
                       ("data.shuffle_window", d.shuffle_window),
                       ("mesh.fsdp", mesh.fsdp), ("mesh.tensor", mesh.tensor),
                       ("mesh.context", mesh.context)]:
        _require(value >= 1, f"{key} must be >= 1, got {value}")
    for key, value in [("model.vocab_size", m.vocab_size), ("model.mlp_dim", m.mlp_dim),
                       ("gdn.num_v_heads", g.num_v_heads), ("gdn.v_head_dim", g.v_head_dim),
                       ("optim.warmup_steps", o.warmup_steps), ("optim.clip_norm", o.clip_norm),
                       ("optim.weight_decay", o.weight_decay), ("train.eval_every", t.eval_every),
                       ("train.checkpoint_every", t.checkpoint_every),
                       ("data.max_documents", d.max_documents),
                       ("cpt.l_ref", c.l_ref), ("cpt.l_tar", c.l_tar)]:
        _require(value >= 0, f"{key} must be >= 0, got {value}")
    _require(t.init_on in ("host", "device"),
             f"train.init_on must be 'host' or 'device', got {t.init_on!r}")
    _require(isinstance(t.compile_cache, str) and t.compile_cache.strip() != "",
             f"train.compile_cache must be 'run', 'off' or a directory, got {t.compile_cache!r}")
    _require(t.on_nonfinite in ("stop", "skip"),
             f"train.on_nonfinite must be 'stop' or 'skip', got {t.on_nonfinite!r}")
    _require(mesh.data == -1 or mesh.data >= 1, f"mesh.data must be -1 or >= 1, got {mesh.data}")

    _require(m.pattern != "" and set(m.pattern) <= set(MIXER_LETTERS),
             f"model.pattern must be a non-empty string over {sorted(MIXER_LETTERS)} "
             f"(A = attention, G = GatedDeltaNet), got {m.pattern!r}")
    _require(m.num_layers % len(m.pattern) == 0,
             f"model.pattern {m.pattern!r} (length {len(m.pattern)}) must tile "
             f"model.num_layers={m.num_layers}")
    _require(m.dtype in DTYPES, f"model.dtype must be one of {DTYPES}, got {m.dtype!r}")
    _require(m.param_dtype in DTYPES,
             f"model.param_dtype must be one of {DTYPES}, got {m.param_dtype!r}")
    _require(m.init_std > 0, f"model.init_std must be > 0, got {m.init_std}")
    _require(m.norm_eps > 0, f"model.norm_eps must be > 0, got {m.norm_eps}")
    if m.moe_experts:
        _require(m.moe_experts >= 1 and 1 <= m.moe_top_k <= m.moe_experts,
                 f"model.moe_top_k must lie in [1, model.moe_experts={m.moe_experts}], "
                 f"got {m.moe_top_k}")
        _require(m.moe_expert_dim >= 0 and m.moe_capacity_factor >= 0
                 and m.moe_aux_loss_coef >= 0,
                 f"model.moe_expert_dim, moe_capacity_factor and moe_aux_loss_coef must be >= 0, "
                 f"got {m.moe_expert_dim}, {m.moe_capacity_factor}, {m.moe_aux_loss_coef}")
    _require(m.moe_experts >= 0, f"model.moe_experts must be >= 0, got {m.moe_experts}")
    _require(not (m.scan_layers and a.no_bias_layers),
             f"model.scan_layers needs every repeat of model.pattern to build the same blocks; "
             f"attention.no_bias_layers={list(a.no_bias_layers)} makes them differ")

    _require(a.kind in ATTENTION_KINDS,
             f"attention.kind must be one of {ATTENTION_KINDS}, got {a.kind!r}")
    _check_foreign_options(config)
    for kind in configured_kinds(config):
        MIXERS[kind].check(config)

    _require(d.source != "", "data.source must not be empty")
    _require(d.shuffle in ("global", "window"),
             f"data.shuffle must be 'global' or 'window', got {d.shuffle!r}")
    _require(d.batch_size % t.grad_accum == 0,
             f"data.batch_size={d.batch_size} must be divisible by train.grad_accum="
             f"{t.grad_accum} (each micro-batch holds batch_size / grad_accum rows)")
    _require(0.0 < d.heldout_fraction < 1.0,
             f"data.heldout_fraction must be in (0, 1), got {d.heldout_fraction}")

    _require(o.name in ("adamw", "muon", "sgd"),
             f"optim.name must be adamw, muon or sgd, got {o.name!r}")
    _require(o.schedule in ("cosine", "constant"),
             f"optim.schedule must be cosine or constant, got {o.schedule!r}")
    _require(o.lr > 0, f"optim.lr must be > 0, got {o.lr}")
    _require(o.alpha_lr_scale > 0, f"optim.alpha_lr_scale must be > 0, got {o.alpha_lr_scale}")
    _require(0 <= o.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    _require(0 <= o.b1 < 1 and 0 <= o.b2 < 1 and 0 <= o.momentum < 1,
             "optim.b1, optim.b2 and optim.momentum must be in [0, 1)")
    _require(o.schedule == "constant" or o.warmup_steps < t.steps,
             f"optim.warmup_steps={o.warmup_steps} must be < train.steps={t.steps} "
             "for the cosine schedule; lower optim.warmup_steps (0: no warm-up) or use "
             "optim.schedule=constant")

    if mesh.context > 1:
        validate_context_parallel(config)

    _require(c.k > 0, f"cpt.k must be > 0, got {c.k}")
    _require(c.mode in ("matrix", "row"), f"cpt.mode must be matrix or row, got {c.mode!r}")
    _require(c.positions in CPT_POSITIONS,
             f"cpt.positions must be one of {CPT_POSITIONS}, got {c.positions!r}")
    _require(c.reference_step >= 0 and c.rope_base >= 0,
             f"cpt.reference_step and cpt.rope_base must be >= 0, got {c.reference_step} and "
             f"{c.rope_base}")
    validate_implementations(config)


def _check_foreign_options(config: Config) -> None:
    """Attention options that only other kinds read keep their defaults."""
    a, defaults = config.attention, AttentionConfig()
    own = MIXERS[a.kind].options if a.kind in MIXERS else ()
    for kind in ATTENTION_KINDS:
        spec = MIXERS[kind]
        changed = [name for name in spec.options
                   if name not in own and getattr(a, name) != getattr(defaults, name)]
        readers = tuple(k for k in ATTENTION_KINDS if set(changed) & set(MIXERS[k].options))
        which = f"={readers[0]!r}" if len(readers) == 1 else f" in {readers}"
        _require(not changed,
                 f"attention.{', attention.'.join(changed)} only appl"
                 f"{'ies' if len(changed) == 1 else 'y'} to attention.kind{which} "
                 f"({spec.title} options: {', '.join(spec.options)}), got kind={a.kind!r}")


def validate_context_parallel(config: Config) -> None:
    """mesh.context > 1: the sequence splits evenly and every mixer has a context-parallel op."""
    context = config.mesh.context
    _require(config.data.seq_len % context == 0,
             f"data.seq_len={config.data.seq_len} must be divisible by mesh.context={context} "
             f"(each device holds seq_len / context tokens)")
    for kind in dict.fromkeys(layer_kinds(config)):
        check = MIXERS[kind].check_context
        _require(check is not None,
                 f"mesh.context={context} supports attention.kind in {CONTEXT_PARALLEL_KINDS} "
                 f"(ring attention), got {kind!r}")
        check(config)


def validate_implementations(config: Config) -> None:
    """Each layer's `implementation` must be registered for the op that layer calls."""
    registries = {**ATTENTION_REGISTRIES, **GDN_REGISTRIES}
    for index, kind in enumerate(layer_kinds(config)):
        spec = MIXERS[kind]
        implementation = getattr(config, spec.section).implementation
        try:
            registries[spec.op_name(config, index)].check_name(implementation)
        except ValueError as error:
            what = "" if kind == spec.section else f" with {spec.section}.kind={kind!r}"
            raise ConfigError(f"{spec.section}.implementation={implementation!r}{what} "
                              f"(layer {index}): {error}") from None


def validate_for_devices(config: Config, device_count: int) -> tuple[int, ...]:
    """(data, fsdp, tensor) mesh sizes for `device_count` devices, with a fourth, context, when
    mesh.context > 1 (train.core.sharding.make_mesh takes either); or ConfigError."""
    mesh = config.mesh
    model_parallel = mesh.fsdp * mesh.tensor * mesh.context
    _require(device_count % model_parallel == 0,
             f"mesh.fsdp * mesh.tensor * mesh.context = {model_parallel} does not divide the "
             f"{device_count} devices")
    data = device_count // model_parallel if mesh.data == -1 else mesh.data
    _require(data * model_parallel == device_count,
             f"mesh data={data} x fsdp={mesh.fsdp} x tensor={mesh.tensor} x context="
             f"{mesh.context} = {data * model_parallel} devices, but {device_count} are available")
    batch_shards = data * mesh.fsdp
    _require(config.data.batch_size % batch_shards == 0,
             f"data.batch_size={config.data.batch_size} must be divisible by "
             f"mesh.data * mesh.fsdp = {batch_shards}")
    micro_batch = config.data.batch_size // config.train.grad_accum
    _require(micro_batch % batch_shards == 0,
             f"the micro-batch data.batch_size / train.grad_accum = {micro_batch} must be "
             f"divisible by mesh.data * mesh.fsdp = {batch_shards}")
    # checkify cannot trace the mixers' shard_map (jax 0.11: "context mesh ... should match
    # the aval mesh"), which every mesh of more than one device uses
    _require(not config.train.check_ranges or device_count == 1,
             f"train.check_ranges=true runs on one device only, got {device_count} devices "
             f"(the checked step cannot trace the mixers' shard_map)")
    return (data, mesh.fsdp, mesh.tensor) + ((mesh.context,) if mesh.context > 1 else ())
