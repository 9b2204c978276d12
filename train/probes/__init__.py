"""Synthetic probes: task generators (tasks.py), small models (model.py), a runner that trains
many seeds at once with vmap (runner.py), Fisher's exact test (stats.py), outputs (report.py)
and the `python -m train probe` command (cli.py)."""

from train.probes.runner import ProbeConfig, run_probe, train_seeds
from train.probes.stats import fisher_greater
from train.probes.tasks import TASKS, ProbeData

__all__ = ["TASKS", "ProbeConfig", "ProbeData", "fisher_greater", "run_probe", "train_seeds"]
