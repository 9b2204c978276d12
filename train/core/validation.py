"""Checks of a Config before anything starts: impossible combinations, the implementations
the layers would call, and (`validate_for_devices`) the mesh for a device count. A failure is
a ConfigError naming the dotted key.

Implementations: `attention.implementation` / `gdn.implementation` are checked at load
against the dispatch registry of the op each layer calls (`fpa_jax.REGISTRIES`,
`gdn_jax.REGISTRIES`; the layer names its op), so e.g. selective attention with "xla" is
refused here, not when the model is traced.
"""

from __future__ import annotations

from fpa_jax import REGISTRIES as ATTENTION_REGISTRIES
from gdn_jax import REGISTRIES as GDN_REGISTRIES
from train.core.config import (ATTENTION_KINDS, CONTEXT_PARALLEL_KINDS, CPT_POSITIONS, DTYPES,
                               MIXER_LETTERS, POSITIONS_BY_KIND, Config, ConfigError)
from train.core.model import build_mixer


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


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

    _require(a.kind in ATTENTION_KINDS,
             f"attention.kind must be one of {ATTENTION_KINDS}, got {a.kind!r}")
    allowed = POSITIONS_BY_KIND[a.kind]
    _require(a.position in allowed,
             f"attention.position={a.position!r} is not available for attention.kind="
             f"{a.kind!r} (allowed: {allowed})")
    _require(a.tau > 0, f"attention.tau must be > 0, got {a.tau}")
    if a.yarn_factor:
        _require(a.kind == "softmax" and a.position == "rope",
                 f"attention.yarn_factor needs attention.kind='softmax' with position='rope', "
                 f"got kind={a.kind!r}, position={a.position!r}")
        _require(a.yarn_factor >= 1 and a.yarn_original_length >= 1,
                 f"attention.yarn_factor must be 0 (off) or >= 1 with attention."
                 f"yarn_original_length >= 1, got {a.yarn_factor} and {a.yarn_original_length}")
    kinds = config.layer_kinds()
    fpa_variant_changed = (a.stack_form, a.key_level, a.query_level, a.content, a.dip_sum,
                           a.tau) != (False, True, False, True, False, 1.0)
    _require(a.kind == "fpa" or not fpa_variant_changed,
             f"attention FPA options (stack_form, key_level, query_level, content, dip_sum, tau) "
             f"only apply to attention.kind='fpa', got kind={a.kind!r}")
    if a.no_bias_layers:
        _require(a.kind == "fpa", f"attention.no_bias_layers only applies to attention.kind='fpa', "
                                  f"got kind={a.kind!r}")
        _require(a.content, "attention.no_bias_layers with attention.content=false leaves those "
                            "layers no attention logits (no bias, no q.k)")
        for index in a.no_bias_layers:
            _require(0 <= index < m.num_layers,
                     f"attention.no_bias_layers: layer {index} out of range [0, {m.num_layers})")
            _require(kinds[index] == "attention",
                     f"attention.no_bias_layers: layer {index} is a {kinds[index]} layer, "
                     f"not an attention layer (pattern {m.pattern!r})")
    if "gdn" in kinds:
        num_v_heads = g.num_v_heads or g.num_heads
        _require(num_v_heads % g.num_heads == 0,
                 f"gdn.num_v_heads={num_v_heads} must be a multiple of gdn.num_heads={g.num_heads}")
    else:
        _require(o.alpha_lr_scale == 1.0 and not o.freeze_gdn_decay,
                 "optim.alpha_lr_scale / optim.freeze_gdn_decay need GatedDeltaNet layers "
                 f"(model.pattern={m.pattern!r} has none)")

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


def validate_context_parallel(config: Config) -> None:
    """mesh.context > 1: the sequence splits evenly and every mixer has a context-parallel op."""
    context, a = config.mesh.context, config.attention
    _require(config.data.seq_len % context == 0,
             f"data.seq_len={config.data.seq_len} must be divisible by mesh.context={context} "
             f"(each device holds seq_len / context tokens)")
    if "attention" not in config.layer_kinds():
        return
    _require(a.kind in CONTEXT_PARALLEL_KINDS,
             f"mesh.context={context} supports attention.kind in {CONTEXT_PARALLEL_KINDS} "
             f"(ring attention), got {a.kind!r}")
    _require(not a.dip_sum, f"mesh.context={context} does not support attention.dip_sum "
                            f"(a dense-only op)")
    _require(a.implementation is None,
             f"attention.implementation={a.implementation!r} must be unset with "
             f"mesh.context={context} (ring attention has a single XLA path)")


def validate_implementations(config: Config) -> None:
    """Each layer's `implementation` must be registered for the op that layer calls."""
    registries = {**ATTENTION_REGISTRIES, **GDN_REGISTRIES}
    for index, kind in enumerate(config.layer_kinds()):
        mixer = build_mixer(config, index, name=None)
        try:
            registries[mixer.op_name].check_name(mixer.implementation)
        except ValueError as error:
            section = "gdn" if kind == "gdn" else "attention"
            what = "" if kind == "gdn" else f" with attention.kind={config.attention.kind!r}"
            raise ConfigError(f"{section}.implementation={mixer.implementation!r}{what} "
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
