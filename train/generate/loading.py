"""A run's model and params for generation: config, tokenizer and checkpoint from its directory.

    load(run_dir, step=None) -> Loaded(config, tokenizer, model, params, step)

The newest readable checkpoint, or `step` (train/core/runs.py, read-only), restored through the
same session as training so its shardings and retired state keys are handled there.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from train.core.config import Config
from train.core.model import LanguageModel
from train.data.tokenizer import Tokenizer


@dataclasses.dataclass
class Loaded:
    config: Config
    tokenizer: Tokenizer
    model: LanguageModel
    params: Any
    step: int


def load(run_dir: str | Path, step: int | None = None) -> Loaded:
    # deferred: `python -m train --help` imports this module; orbax, optax and grain load
    # only when a run is read
    from train.core.runs import load_run, restore_run_state
    from train.core.session import build_session

    config, tokenizer = load_run(run_dir)
    session = build_session(config, tokenizer.vocab_size)
    restored = restore_run_state(run_dir, session, step)
    return Loaded(config, tokenizer, session.model, restored.state["params"], restored.step)
