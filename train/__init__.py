"""Sharded trainer for the FPA and GatedDeltaNet language models (`python -m train --help`).

    config      YAML presets (with `base:` inheritance) + overrides -> validated Config
    data        documents -> packed rows -> batches (grain)       tokenizer: byte or BPE
    model       the decoder-only LM over the mixers of fpa_jax / gdn_jax
    optimizer   schedules, parameter groups (gdn_jax.optimizer_labels), AdamW / Muon / SGD
    sharding    mesh and logical-axis rules
    step        loss of a packed batch; the pure train and eval steps
    session     model + optimizer + shardings + jitted steps for one config on one mesh
    fit         the training loop (checkpoints, eval, preemption), adapted through FitHooks
    evaluate    held-out and per-position loss            runs: a run directory on disk
    cpt         SpectralShift continued pretraining (fit with hooks)
    bench       train-step throughput and memory
    checkpoint  Orbax checkpoints of state + data iterator + record
    metrics, plot, cli
"""
