"""A train step whose update makes every parameter inf after a chosen step, while its loss and
gradient norm stay finite: the case the trainer must never checkpoint."""

import jax
import jax.numpy as jnp

import train.core.session


def overflow_parameters_after(monkeypatch, step: int) -> None:
    """Sessions built from now on train normally, except that the update of step `step`
    (state["step"] == step before it) leaves every parameter inf."""
    original = train.core.session.make_train_step

    def make_train_step(*args):
        step_fn = original(*args)

        def overflowing(state, batch):
            new_state, metrics = step_fn(state, batch)
            blow_up = lambda x: jnp.where(state["step"] == step, jnp.inf, x)
            return {**new_state, "params": jax.tree.map(blow_up, new_state["params"])}, metrics

        return overflowing

    monkeypatch.setattr(train.core.session, "make_train_step", make_train_step)
