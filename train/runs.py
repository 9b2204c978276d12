"""A training run on disk: its config, tokenizer and checkpoints.

    run_dir/config.json       the fully resolved config (train/checkpoint.py save_run_files)
    run_dir/tokenizer/        the run's tokenizer
    run_dir/checkpoints/      Checkpointer steps (train/checkpoint.py)
"""

from __future__ import annotations

from pathlib import Path

from train import checkpoint as ckpt
from train.config import Config, config_from_dict
from train.session import RETIRED_STATE_KEYS, Session
from train.tokenizer import Tokenizer, load_tokenizer

CHECKPOINT_DIRNAME = "checkpoints"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIRNAME


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
    checkpointer = ckpt.Checkpointer(checkpoint_dir(run_dir))
    try:
        if step is None:
            restored = checkpointer.restore_latest(session.abstract_state,
                                                   ignore_saved=RETIRED_STATE_KEYS)
            if restored is None:
                raise FileNotFoundError(f"{run_dir}: no checkpoint in {checkpointer.directory}")
            return restored
        return checkpointer.restore(step, session.abstract_state, ignore_saved=RETIRED_STATE_KEYS)
    finally:
        checkpointer.close()
