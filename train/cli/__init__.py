"""Command line: `python -m train COMMAND ...` (see `python -m train --help`).

    fit CONFIG [key=value ...]      train (resumes if the run directory has checkpoints)
    cpt CONFIG [key=value ...]      SpectralShift continued pretraining from cpt.reference
    stages CURRICULUM [key=value]   staged extension: a chain of cpt runs
                                    (train/experiments/stages.py)
    spectra RUN [--compare RUN2]    GDN decay spectra / slow band on needle inputs
                                    (train/experiments/spectra.py)
    eval RUN_DIR                    held-out loss (and per-position loss) of a run's checkpoint
                                    (--suite long: passkey / needle retrieval,
                                    train/experiments/long_eval.py)
    prepare --source S --out DIR    tokenizer (byte or trained BPE) + ArrayRecord shards
    plot RUN_DIR                    loss.png and position_loss.png
    bench CONFIG [key=value ...]    tokens/s and peak memory of the train step
    config CONFIG [key=value ...]   the resolved config (YAML) and its differences from the preset
    main [key=value ...]            the tiny FPA preset end to end, with a summary table
    export RUN --out DIR            a run's checkpoint as safetensors + config.json (fla layout,
                                    or --format fpa-torch; train/tools/export.py)
    generate RUN --prompt TEXT      sample a continuation from a run's checkpoint (cached
                                    decoding, train/generate/)
    probe TASK [key=value ...]      synthetic-task probes over many seeds (`probe list`, `probe
                                    --help`; train/probes/cli.py)

Run directory of fit/cpt/main: --run-dir, else train.run_dir, else runs/<config>[-<hash of the
overrides>] (train/core/runs.py), so re-running a command resumes its run; --new starts another.
The first line says which ("new run in DIR" / "resuming DIR from step N").

Exit codes:
    0    finished (or nothing left to do)
    1    error: a user mistake (data, checkpoints, run directory), printed as one line
         `error: ...` (-v: with the traceback)
    2    invalid command line or config (argparse; a bad preset, override or YAML file)
    3    training diverged (non-finite loss or gradient norm, train.on_nonfinite=stop; or
         non-finite parameters or optimizer state, either mode)
    75   stopped by SIGTERM/SIGINT after checkpointing: re-run the same command to resume
         (EX_TEMPFAIL: a scheduler should requeue); also SIGTERM before training started
         (loading, restoring, compiling) or outside `fit` (but `generate`): nothing new was
         saved, re-running continues from the last checkpoint
    130  SIGINT (Ctrl-C) before training started, or outside `fit`; SIGTERM to `generate`
         (nothing to resume or requeue)
-v prints the traceback before the `error:` line and keeps these codes. argparse refusals are
one line too (`error: python -m train eval: argument --seq-len: ...`); key=value overrides may
follow options. A genuine bug is not caught: Python prints its traceback and exits 1.

The codes, UserError and the one-line parser are defined in train/core/errors.py (re-exported
here), so that commands below this package (`probe`'s train/probes/cli.py,
`python -m train.experiments.lm_compare`) use the same ones.
"""

from train.core.errors import (EXIT_DIVERGED, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_PREEMPTED,
                               EXIT_USAGE, OneLineParser, UserError, print_error)

__all__ = ["EXIT_DIVERGED", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_PREEMPTED", "EXIT_USAGE",
           "OneLineParser", "UserError", "print_error"]
