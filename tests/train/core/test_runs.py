"""Runs on disk written by older trainers: the per-step "rng" they saved, and the SpectralShift
markers they kept at the top level of the checkpoint record."""

import jax
import jax.numpy as jnp
import numpy as np

from train.checkpoint.manager import Checkpointer
from train.core.presets import load_config
from train.core.runs import checkpoint_dir, restore_run_state
from train.core.session import build_session
from train.experiments.cpt import MARKERS_KEY, applied_markers


def test_checkpoint_with_the_old_rng_restores_without_it(tmp_path):
    config = load_config(None, ["model.d_model=16", "model.num_layers=1", "attention.kind=softmax",
                                "attention.num_heads=2", "attention.head_dim=8", "data.seq_len=8"])
    session = build_session(config, 257)
    rng = np.random.default_rng(4)
    state = jax.tree.map(
        lambda x: jax.device_put(jnp.asarray(rng.standard_normal(x.shape), x.dtype), x.sharding),
        session.abstract_state)
    assert set(state) == {"step", "params", "opt_state"}
    with Checkpointer(checkpoint_dir(tmp_path), save_interval_steps=1) as checkpointer:
        checkpointer.save(5, state={**state, "rng": jax.random.split(jax.random.PRNGKey(0))[1]})
    restored = restore_run_state(tmp_path, session)
    assert restored.step == 5 and set(restored.state) == set(state)
    for old, new in zip(jax.tree.leaves(state), jax.tree.leaves(restored.state)):
        np.testing.assert_array_equal(np.asarray(new), np.asarray(old))


def test_spectral_shift_markers_old_and_new_records():
    marker = {"l_ref": 16, "l_tar": 64, "s": 0.5}
    assert applied_markers({"extra": {MARKERS_KEY: [marker]}}) == [marker]
    assert applied_markers({MARKERS_KEY: [marker], "extra": {}}) == [marker]   # older trainers
    assert applied_markers({"extra": {}}) == []
