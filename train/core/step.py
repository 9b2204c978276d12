"""The loss of a packed batch, and the train and eval steps built on it (pure functions).

    batch       {"tokens", "segment_ids"} int32 [B, L+1]
    view        inputs, targets, segment_ids, loss_mask [B, L]   (split_inputs_and_targets)
    logits      model(inputs, segment_ids)                                   float32 [B, L, V]
    losses      CE(logits_bj, target_bj)                                     float32 [B, L]
    loss        sum_bj mask_bj * losses_bj / max(1, sum_bj mask_bj)          float32 []
    aux         the MoE layers' load-balancing terms per position (0 without MoE,
                train/core/moe.py); the train loss uses losses + aux, eval reports losses alone
    train step  grads = d loss / d params;  updates, opt_state = tx(grads, opt_state, params);
                params += updates;  step += 1
    accumulation with k micro-batches m_i (row r of the batch in m_{r mod k}):
                loss  = sum_i S_i / max(1, sum_i N_i)
                grads = sum_i dS_i/dparams / max(1, sum_i N_i)
                S_i = sum_bj mask_bj losses_bj over m_i, N_i = sum_bj mask_bj over m_i: the
                loss and gradient of the whole batch, with the activations of one micro-batch
    eval step   sums, so that batches add up: loss_sum, count, and per position bucket
                bucket_j = min(p_j // ceil(L / nb), nb - 1), p_j the position of input j in
                its document (0 at each document start): the prediction made with p_j + 1
                tokens of context
    state       {"step": int32 [], "params", "opt_state"}

The mask drops the position holding a document's end-of-document token (its target starts
the next document); the segment ids the model sees are the packer's (train/data/pipeline.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from train.core.model import positions_within_documents
from train.core.moe import apply_with_auxiliary_loss
from train.data.pipeline import split_inputs_and_targets

State = dict[str, Any]


def token_losses(model: nn.Module, params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """logits [B, L, V]; losses (CE per position), aux (MoE balancing term per position),
    mask (float32, 1 where the target is scored) and the segment_ids the model saw, each [B, L]."""

    view = split_inputs_and_targets(batch)
    logits, aux = apply_with_auxiliary_loss(model, params, view["inputs"], view["segment_ids"])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, view["targets"])
    return {"logits": logits, "losses": losses, "aux": aux,
            "mask": view["loss_mask"].astype(jnp.float32), "segment_ids": view["segment_ids"]}


def masked_mean(losses: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def make_train_step(model: nn.Module, optimizer: optax.GradientTransformation,
                    schedule: optax.Schedule,
                    grad_accum: int = 1) -> Callable[[State, dict], tuple[State, dict]]:
    """state, batch -> new state, {"loss", "grad_norm", "lr", "target_tokens"}.
    grad_accum = k > 1: the batch's B rows (B % k == 0) run as k micro-batches (module doc)."""
    if not isinstance(grad_accum, int) or grad_accum < 1:
        raise ValueError(f"grad_accum: expected an int >= 1, got {grad_accum!r}")

    def loss_fn(params, batch):
        terms = token_losses(model, params, batch)
        return masked_mean(terms["losses"] + terms["aux"], terms["mask"]), jnp.sum(terms["mask"])

    def summed_loss_fn(params, batch):
        terms = token_losses(model, params, batch)
        return jnp.sum((terms["losses"] + terms["aux"]) * terms["mask"]), jnp.sum(terms["mask"])

    def accumulated_loss_and_grads(params, batch):
        rows = batch["tokens"].shape[0]
        if rows % grad_accum:
            raise ValueError(f"batch: {rows} rows do not split into grad_accum={grad_accum} "
                             "micro-batches")
        micro = jax.tree.map(
            lambda x: jnp.swapaxes(x.reshape(rows // grad_accum, grad_accum, *x.shape[1:]), 0, 1),
            batch)

        def add(carry, micro_batch):
            loss_sum, count, grads = carry
            (s, n), g = jax.value_and_grad(summed_loss_fn, has_aux=True)(params, micro_batch)
            return (loss_sum + s, count + n, jax.tree.map(jnp.add, grads, g)), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        (loss_sum, count, grads), _ = jax.lax.scan(
            add, (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zeros), micro)
        denominator = jnp.maximum(count, 1.0)
        return loss_sum / denominator, count, jax.tree.map(lambda g: g / denominator, grads)

    def train_step(state, batch):
        if grad_accum == 1:
            (loss, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                state["params"], batch)
        else:
            loss, count, grads = accumulated_loss_and_grads(state["params"], batch)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state}
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
                   "lr": schedule(state["step"]), "target_tokens": count}
        return new_state, metrics

    return train_step


def make_eval_step(model: nn.Module, seq_len: int,
                   buckets: int) -> Callable[[Any, dict], dict[str, jax.Array]]:
    """params, batch -> {"loss_sum", "count", "bucket_loss_sum" [nb], "bucket_count" [nb],
    "document_loss_sum" [B, L+1], "document_count" [B, L+1]}: the last two per row and segment
    id (the packer's document pieces, 1, 2, ... within a row; 0 is padding), for paired
    per-document comparisons of models on the same batches (train/core/evaluate.py)."""
    width = -(-seq_len // buckets)

    def eval_step(params, batch):
        terms = token_losses(model, params, batch)
        losses, mask = terms["losses"], terms["mask"]
        bucket = jnp.minimum(positions_within_documents(terms["segment_ids"]) // width,
                             buckets - 1)
        rows, length = mask.shape
        row = jnp.arange(rows)[:, None]
        pieces = jnp.zeros((rows, length + 1), jnp.float32)
        return {"loss_sum": jnp.sum(losses * mask), "count": jnp.sum(mask),
                "bucket_loss_sum": jnp.zeros(buckets, jnp.float32).at[bucket].add(losses * mask),
                "bucket_count": jnp.zeros(buckets, jnp.float32).at[bucket].add(mask),
                "document_loss_sum": pieces.at[row, terms["segment_ids"]].add(losses * mask),
                "document_count": pieces.at[row, terms["segment_ids"]].add(mask)}

    return eval_step
