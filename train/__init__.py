"""Sharded trainer for the FPA and GatedDeltaNet language models (`python -m train --help`).

    data         tokenizers (byte, BPE), document sources, the packed-batch pipeline (grain)
    checkpoint   Orbax checkpoints of state + data iterator, the run's files, preemption
    core         config (schema, presets, validation), model, sharding, optimizer, step,
                 session, memory, metrics, evaluate, runs, fit (the training loop), errors
                 (UserError and the exit codes of every command line)
    experiments  continued pretraining (cpt) and its stages, lm_compare, long_eval, spectra
    tools        bench, profile traces, plots, export (safetensors)
    probes       synthetic-task probes            generate: cached decoding and sampling
    cli          one module per `python -m train` command

Listed bottom to top: a subpackage imports only from its own layer and the ones listed before
it; experiments, tools, probes and generate are one layer (docs/architecture.md, "The training
package"; tests/test_import_layers.py checks it).
"""
