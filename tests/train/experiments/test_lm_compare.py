"""The language-model comparison's summaries, table and argument checks (no training here: the
committed results/lm_compare_cpu run is the end-to-end check)."""

import numpy as np
import pytest

from tests.seeds import case_seed
from train.core.presets import load_config
from train.experiments.lm_compare import MODELS, markdown_table, parse_arguments, plot, span_losses


def test_span_losses_are_token_weighted_means_of_their_buckets():
    rng = np.random.default_rng(case_seed(1))
    loss, tokens = rng.uniform(2, 4, size=16), rng.integers(1, 50, size=16)
    loss_list = loss.tolist()
    loss_list[13] = None                          # an empty bucket is left out
    position = {"seq_len": 64, "position_bucket_start": list(range(0, 64, 4)),
                "position_loss": loss_list, "position_tokens": tokens.tolist()}
    spans = span_losses(position, 16)             # 4 spans of 4 buckets
    for k in range(4):
        keep = [i for i in range(4 * k, 4 * k + 4) if loss_list[i] is not None]
        assert spans[k] == pytest.approx(np.average(loss[keep], weights=tokens[keep]))


def fake_row(model, loss):
    position = {"seq_len": 64, "position_bucket_start": [0, 16, 32, 48],
                "position_loss": [loss, loss + 0.1, None, loss + 0.2],
                "position_tokens": [10, 10, 0, 10]}
    return {"model": model, "params": 37000, "tokens": 61440, "train_seq_len": 16,
            "heldout_loss": loss, "span_loss": span_losses(position, 16),
            "passkey": [None, 0.5, 0.25, 0.0], "train_seconds": 12.0,
            "long_eval": {"passkey": {"samples": 4, "depths": [0.0, 1.0]},
                          "position_loss": position}}


def test_table_has_a_row_per_model_and_every_column(tmp_path):
    rows = [fake_row("fpa", 3.2), fake_row("gdn", 3.5)]
    table = markdown_table(rows, "cpu").splitlines()
    body = [line for line in table if line.startswith("| ")]
    assert len(body) == 3 and "passkey 8L" in body[0] and "loss 3-4L" in body[0]
    assert body[1].split(" | ")[:4] == ["| fpa", "0.037M", "0.06M", "3.2000"]
    assert "| - | 0.50 | 0.25 | 0.00 |" in body[1]        # 1L did not fit
    assert "2 depths x 4 samples" in table[0]
    plot(rows, tmp_path / "lm_compare.png")
    assert (tmp_path / "lm_compare.png").stat().st_size > 1000


@pytest.mark.parametrize("size", ["cpu", "h200"])
def test_every_model_has_a_preset_with_the_same_data_and_budget(size):
    configs = {m: load_config(f"lmc_{size}_{m}", []) for m in MODELS}
    budgets = {(c.data.source, c.data.seq_len, c.data.batch_size, c.train.steps, c.optim.lr)
               for c in configs.values()}
    assert len(budgets) == 1
    hybrid = configs["hybrid"]
    assert hybrid.layer_sections().count("gdn") >= 1
    assert hybrid.attention.kind == "fpa" and "attention" in hybrid.layer_sections()
    assert {c.attention.kind for m, c in configs.items() if m != "gdn"} == {
        "fpa", "fox", "softmax", "selective"}


def test_h200_models_have_the_papers_shape_and_matched_parameters():
    """12 layers of width 768, heads of 64, context 2048; GDN and the hybrid narrow their MLP
    so that every model has FPA's parameter count within 0.5%."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from train.core.model import LanguageModel
    counts = {}
    for model in MODELS:
        config = load_config(f"lmc_h200_{model}", [])
        assert (config.model.num_layers, config.model.d_model, config.data.seq_len) == (12, 768, 2048)
        tokens = jnp.zeros((1, 8), jnp.int32)
        shapes = jax.eval_shape(LanguageModel(config, config.model.vocab_size).init,
                                jax.random.PRNGKey(0), tokens, jnp.ones_like(tokens))
        counts[model] = sum(x.size for x in jax.tree.leaves(nn.meta.unbox(shapes)))
    for model, count in counts.items():
        assert abs(count / counts["fpa"] - 1) < 5e-3, (model, count, counts["fpa"])


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        parse_arguments(["--size", "cpu", "--models", "fpa,nope"])
    assert info.value.code == 2 and "--models" in capsys.readouterr().err
    assert parse_arguments(["--size", "h200"]).samples == 20


def with_documents(row, losses, passkey_counts):
    tokens = [5, 7, 3, 9]
    return {**row, "heldout_documents": {"loss_sum": [l * t for l, t in zip(losses, tokens)],
                                         "tokens": tokens},
            "passkey_counts": passkey_counts}


def test_paired_bootstrap_interval_holds_the_difference():
    from train.experiments.lm_compare import paired_bootstrap
    rng = np.random.default_rng(case_seed(2))
    tokens = rng.integers(50, 500, 200)
    loss_b = rng.uniform(2.0, 4.0, 200) * tokens
    loss_a = loss_b - (0.02 + 0.01 * rng.standard_normal(200)) * tokens
    diff, low, high = paired_bootstrap(loss_a, loss_b, tokens)
    assert diff == pytest.approx((loss_a - loss_b).sum() / tokens.sum())
    assert low < diff < high < 0.0 and high - low < 0.01
    # paired: the per-piece spread of the two models' losses (1-3 nats) does not widen it
    assert paired_bootstrap(loss_b, loss_b, tokens) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equal-length"):
        paired_bootstrap(loss_a, loss_b[:-1], tokens)


def test_comparison_with_fox_and_merge(tmp_path, capsys):
    import json

    from train.experiments.lm_compare import comparison_table, main
    fox = with_documents(fake_row("fox", 3.3), [3.3, 3.4, 3.2, 3.3], [None, [40, 100], [10, 100], [0, 100]])
    fpa = with_documents(fake_row("fpa", 3.2), [3.2, 3.3, 3.1, 3.2], [None, [90, 100], [60, 100], [5, 100]])
    table = comparison_table([fpa, fox])
    body = [line for line in table.splitlines() if line.startswith("| ")]
    assert body[1].startswith("| fpa | -0.1000 (-0.1000, -0.1000) | - | 90/100 (")
    assert body[2] == "| fox | - | - | 40/100 | 10/100 | 0/100 |"
    assert comparison_table([fpa]) == ""
    other = with_documents(fake_row("gdn", 3.0), [3.0] * 4, fox["passkey_counts"])
    other["heldout_documents"]["tokens"] = [5, 7, 3, 8]
    with pytest.raises(ValueError, match="gdn: its held-out document pieces differ"):
        comparison_table([other, fox])

    for name, row in (("a", fpa), ("b", fox)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lm_compare.json").write_text(json.dumps({"size": "cpu", "rows": [row]}))
    files = [str(tmp_path / n / "lm_compare.json") for n in ("a", "b")]
    assert main(["--merge", *files, "--out", str(tmp_path / "merged")]) == 0
    merged = (tmp_path / "merged" / "lm_compare.md").read_text()
    assert "| fpa | -0.1000" in merged and (tmp_path / "merged" / "lm_compare.png").exists()
    assert main(["--merge", files[0], files[0], "--out", str(tmp_path / "m2")]) == 2
    assert "each model once" in capsys.readouterr().err


def test_passkey_counts_sum_depths_and_skip_lengths_that_do_not_fit():
    from train.experiments.lm_compare import passkey_counts
    passkey = {"lengths": [16, 32], "samples": 20,
               "accuracy": [[None, 0.5], [None, 0.25], [None, 1.0]]}
    assert passkey_counts(passkey) == [None, [35, 60]]
