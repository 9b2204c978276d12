"""run_probe's success counts: a seed succeeds when its final held-out accuracy strictly exceeds
the task's threshold (an accuracy exactly at the threshold is a failure); the Fisher p-values
are computed from those counts; after each method but the last, the result so far is handed
out (the CLI writes it, so a stopped run keeps what it finished). The per-seed training is
replaced by chosen accuracies."""

import numpy as np
import pytest

from train.probes import runner
from train.probes.runner import ProbeConfig, run_probe
from train.probes.stats import fisher_greater
from train.probes.tasks import TASKS, live_names_layout
from tests.seeds import case_seed


def chosen_accuracies(monkeypatch, finals):
    """train_seeds returns, per method, curves [S, 2] whose last column is finals[method]
    (float32, as the trainer's accuracies are); the first column is above every threshold."""
    calls = []

    def train_seeds(method, task, sizes, config):
        calls.append(method)
        final = np.asarray(finals[method], np.float32)
        assert final.shape == (config.seeds,)
        accuracy = np.stack([np.ones_like(final), final], axis=1)
        return {"seeds": list(range(config.seeds)), "loss": np.zeros_like(accuracy),
                "accuracy": accuracy, "seconds": 0.0}

    monkeypatch.setattr(runner, "train_seeds", train_seeds)
    return calls


@pytest.mark.parametrize("task", ["ladder", "mqar", "flip_flop"])  # 0.95, 0.9, 0.99
def test_successes_count_the_seeds_strictly_above_the_threshold(monkeypatch, task):
    threshold = TASKS[task].threshold
    at = np.float32(threshold)                                   # exactly at the threshold
    above = np.nextafter(at, np.float32(1))                      # the next float32 above it
    below = np.nextafter(at, np.float32(0))
    rng = np.random.default_rng(case_seed(2921))
    finals = {
        "fpa": [at, above, 1.0, below, 0.0, above],              # 3 successes
        "fox": [at, at, below, 1.0, 0.25, 0.5],                  # 1 success
        "softmax_nope": [at] * 6,                                # 0 successes
    }
    for method in finals:                                        # order must not matter
        finals[method] = list(rng.permutation(np.asarray(finals[method], np.float32)))
    calls = chosen_accuracies(monkeypatch, finals)
    config = ProbeConfig(seeds=6, steps=2, eval_every=1)
    result = run_probe(task, list(finals), config)
    assert calls == list(finals)
    assert result["threshold"] == threshold
    successes = {m: r["successes"] for m, r in result["methods"].items()}
    assert successes == {"fpa": 3, "fox": 1, "softmax_nope": 0}
    for method, run in result["methods"].items():
        assert run["seeds"] == 6
        np.testing.assert_array_equal(run["final_accuracy"], np.float32(finals[method]))
    assert result["fisher"] == {"fox": fisher_greater(3, 6, 1, 6),
                                "softmax_nope": fisher_greater(3, 6, 0, 6)}


def test_every_seed_above_or_below_the_threshold(monkeypatch):
    finals = {"fpa": [1.0, 0.96, 0.951], "fox": [0.95, 0.5, 0.0]}
    chosen_accuracies(monkeypatch, finals)
    result = run_probe("ladder", ["fpa", "fox"], ProbeConfig(seeds=3, steps=2, eval_every=1))
    assert result["methods"]["fpa"]["successes"] == 3
    assert result["methods"]["fox"]["successes"] == 0
    assert result["fisher"] == {"fox": fisher_greater(3, 3, 0, 3)}


def test_the_result_so_far_follows_each_method_but_the_last(monkeypatch):
    finals = {"fox": [0.5, 1.0, 1.0], "fpa": [1.0, 1.0, 1.0], "softmax_nope": [0.0, 0.0, 1.0]}
    chosen_accuracies(monkeypatch, finals)
    partials = []
    result = run_probe("ladder", list(finals), ProbeConfig(seeds=3, steps=2, eval_every=1),
                       after_method=partials.append)
    assert [list(p["methods"]) for p in partials] == [["fox"], ["fox", "fpa"]]
    assert partials[0]["fisher"] == {}                      # the reference (fpa) had not run
    assert partials[1]["fisher"] == {"fox": fisher_greater(3, 3, 2, 3)}
    assert list(result["methods"]) == list(finals)
    assert partials[1]["methods"]["fox"] == result["methods"]["fox"]


def test_the_cli_writes_the_result_after_each_method(monkeypatch, tmp_path):
    from train.probes import cli
    finals = {"fpa": [1.0, 1.0], "fox": [0.0, 1.0]}
    chosen_accuracies(monkeypatch, finals)
    written = []
    monkeypatch.setattr(cli, "write_outputs",
                        lambda result, out: written.append(list(result["methods"])) or {})
    assert cli.main(["ladder", "methods=fpa,fox", "seeds=2", "steps=2", "eval_every=1",
                     f"out={tmp_path}"]) == 0
    assert written == [["fpa"], ["fpa", "fox"]]


def test_bos_prepends_one_unscored_token_with_a_new_id():
    """config.bos: every sequence of both splits starts with id vocab_size (the task's ids keep
    theirs), its target is PAD and unscored, and the vocabulary grows by one."""
    sizes = {"levels": 6, "num_keys": 4, "num_values": 6, "num_dips": 2}
    plain = runner.seed_data("live_names", [3], sizes, ProbeConfig(train_size=8, test_size=4))
    with_bos = runner.seed_data("live_names", [3], sizes,
                                ProbeConfig(train_size=8, test_size=4, bos=True))
    for a, b in zip(plain, with_bos):
        assert b.vocab_size == a.vocab_size + 1
        assert (b.tokens[..., 0] == a.vocab_size).all()
        assert (b.targets[..., 0] == 0).all() and not b.mask[..., 0].any()
        np.testing.assert_array_equal(b.tokens[..., 1:], a.tokens)
        np.testing.assert_array_equal(b.targets[..., 1:], a.targets)
        np.testing.assert_array_equal(b.mask[..., 1:], a.mask)


def test_without_bos_a_dead_first_key_decides_seven_percent_of_live_names():
    """Selective Attention never masks a sequence's first token (its formula:
    tests/fpa_jax/baselines/test_baselines.py). In live names (the defaults) that token is a
    key, later killed by a dip, for about 7% of the scored answers' keys: a model that cannot
    remove it is capped near 0.93, below the 0.95 bar; `bos=true` puts a BOS token there."""
    names = 12
    data = TASKS["live_names"].generate(case_seed(560), 4000)
    layout = live_names_layout(12, names)
    first = data.tokens[:, 0]
    first_name = np.where((first >= layout["key"]) & (first < layout["dip"]),
                          (first - layout["key"]) % names, -1)
    asked = np.where(data.mask, data.tokens - layout["ask"], -2)
    about_dead_first = data.mask & (asked == first_name[:, None]) & (data.targets == layout["dead"])
    share = about_dead_first.sum() / data.mask.sum()
    assert 0.05 < share < 0.10, share
