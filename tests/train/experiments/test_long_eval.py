"""Long-context suite: sample construction, teacher-forced scoring against planted oracles, and
`python -m train eval RUN --suite long` on a 3-step tiny run (JSON, PNGs, one-line errors)."""

import json
import re

import numpy as np
import pytest

from tests.seeds import case_seed
from train.data.tokenizer import ByteTokenizer
from train.experiments.long_eval import retrieval_accuracy
from train.experiments.long_eval_tasks import TASKS, answer_correct, make_sample

TOKENIZER = ByteTokenizer()
NUMBER = re.compile(r"\d{5,7}")


def random_haystack(seed, size=3000):
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "x", "=", "(", ")", "\n"]
    return np.asarray(TOKENIZER.encode(" ".join(rng.choice(words, size=size // 4))), np.int32)


def expected_answer(task, text_before_answer):
    """The answer an ideal reader derives from the prompt text alone."""
    body, question = text_before_answer.rsplit("\n", 1)
    if task == "passkey":
        return " " + re.search(r"The pass key is (\d+)\.", body).group(1)
    magic = dict(re.findall(r"magic numbers? for ([a-z]+-[a-z]+) is: (\d+)\.", body))
    if task == "needle_multivalue":
        return " " + ", ".join(re.findall(r"magic numbers for [a-z-]+ is: (\d+)\.", body))
    asked = re.findall(r"([a-z]+-[a-z]+)", question.split("?")[0])
    return " " + ", ".join(magic[k] for k in asked)


@pytest.mark.parametrize("task", TASKS)
def test_samples_have_the_length_the_needles_and_the_answer(task):
    haystack = random_haystack(case_seed(1))
    rng = np.random.default_rng(case_seed(2))
    for length in (400, 777):
        for depth in (0.0, 0.4, 1.0):
            sample = make_sample(task, TOKENIZER.encode, haystack, length, depth, rng)
            assert sample.tokens.shape == (length,) and sample.tokens.dtype == np.int32
            text = TOKENIZER.decode(sample.tokens)
            prompt = TOKENIZER.decode(sample.tokens[:sample.answer_start])
            assert TOKENIZER.decode(sample.tokens[sample.answer_start:]) == sample.answer
            assert sample.answer == expected_answer(task, prompt)
            for start in sample.needle_starts:     # each needle begins where it says
                assert TOKENIZER.decode(sample.tokens[start:start + 4]) in ("\nThe", "\nOne")
            needles = re.findall(r"\n(?:The pass key|The special magic number for|One of)"
                                 r"[^\n?]*\.\n", text)
            assert len(needles) == len(sample.needle_starts) == {
                "passkey": 1, "needle_single": 1, "needle_multikey": 4,
                "needle_multivalue": 3, "needle_multiquery": 4}[task]
    assert make_sample(task, TOKENIZER.encode, haystack, 40, 0.5, rng) is None  # too short


def test_depth_places_the_needle_among_the_haystack_tokens():
    haystack = random_haystack(case_seed(3))
    for depth, where in ((0.0, 0), (1.0, None)):
        sample = make_sample("passkey", TOKENIZER.encode, haystack, 300, depth,
                             np.random.default_rng(case_seed(4)))
        (start,) = sample.needle_starts
        if where == 0:
            assert start == 0
        else:   # at depth 1 the needle directly precedes the question
            needle = TOKENIZER.decode(sample.tokens[start:])
            assert re.match(r"\nThe pass key is \d+\. Remember it\. \d+ is the pass key\.\n"
                            r"\nWhat is the pass key\? The pass key is \d+$", needle), needle


def oracle(shift=1, corrupt_last=False):
    """predict(tokens) planting the true next token (shift=1), or a wrong guess."""

    def predict(tokens):
        predicted = np.roll(tokens, -shift, axis=1) if shift else tokens.copy()
        if corrupt_last:
            predicted[:, -2] += 1          # the prediction of the last answer token
        return predicted

    return predict


def test_planted_answers_are_scored_right_and_wrong_ones_wrong():
    haystack = random_haystack(case_seed(5))
    kwargs = dict(lengths=(60, 400, 512), depths=(0.0, 0.5, 1.0), num_samples=5,
                  seed=case_seed(6), batch_size=2)
    for task in TASKS:
        perfect = retrieval_accuracy(oracle(), TOKENIZER.encode, haystack, task=task, **kwargs)
        assert [row[1:] for row in perfect] == [[1.0, 1.0]] * 3, task
        assert [row[0] for row in perfect] == [None] * 3      # 60 tokens: too short
        for wrong in (oracle(shift=0), oracle(corrupt_last=True)):
            scores = retrieval_accuracy(wrong, TOKENIZER.encode, haystack, task=task, **kwargs)
            assert [row[1:] for row in scores] == [[0.0, 0.0]] * 3, task
    sample = make_sample("needle_single", TOKENIZER.encode, haystack, 200, 0.3,
                         np.random.default_rng(0))
    predicted = np.roll(sample.tokens, -1)
    predicted[:sample.answer_start - 1] = 0        # the prompt's predictions do not count
    assert answer_correct(predicted, sample)
    predicted[sample.answer_start - 1] += 1        # the first answer token does
    assert not answer_correct(predicted, sample)


def test_a_cells_samples_do_not_depend_on_the_other_cells():
    haystack = random_haystack(case_seed(8))
    seen = {}

    def recording(key):
        def predict(tokens):
            seen.setdefault(key, []).append(tokens.copy())
            return tokens
        return predict

    for key, lengths in (("alone", (400,)), ("with others", (200, 400))):
        retrieval_accuracy(recording(key), TOKENIZER.encode, haystack, task="passkey",
                           lengths=lengths, depths=(0.5,), num_samples=3, seed=4, batch_size=3)
    np.testing.assert_array_equal(seen["alone"][0], seen["with others"][1])


# ------------------------------------------------------------------------ on a trained run


@pytest.fixture(scope="module")
def tiny_run(tiny_trained_run, tmp_path_factory):
    """A copy of the session's tiny run (tests/train/tiny_run.py: 2 steps at data.seq_len=16,
    its corpus beside the run directory, never around it)."""
    from tests.train.tiny_run import copy_run

    return copy_run(tiny_trained_run, tmp_path_factory.mktemp("long") / "run")


@pytest.mark.slow
def test_suite_long_writes_every_cell_and_a_heatmap_per_task(tiny_run, tmp_path, capsys):
    from train.cli.entry import main

    out = tmp_path / "long"
    assert main(["eval", str(tiny_run), "--suite", "long", "--lengths", "110,400",
                 "--depths", "0,1", "--samples", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "passkey" in printed and "per-position held-out loss at 64 tokens" in printed
    result = json.loads((out / "long_eval.json").read_text())
    assert result["step"] == 2 and result["train_seq_len"] == 16
    for task in TASKS:
        cell = result[task]
        assert cell["lengths"] == [110, 400] and cell["depths"] == [0.0, 1.0]
        assert np.shape(cell["accuracy"]) == (2, 2)
        assert all(a is None or 0.0 <= a <= 1.0 for row in cell["accuracy"] for a in row)
        assert all(a is not None for row in cell["accuracy"] for a in row[1:])
        assert (out / f"long_eval_{task}.png").stat().st_size > 1000
    assert result["passkey"]["accuracy"][0][0] is not None            # passkey fits in 110
    assert result["needle_multikey"]["accuracy"][0][0] is None         # four needles do not
    losses = result["position_loss"]
    assert losses["seq_len"] == 64 and len(losses["position_loss"]) == 8
    assert losses["position_bucket_start"] == [0, 8, 16, 24, 32, 40, 48, 56]
    assert np.isfinite(losses["loss"]) and (out / "long_eval_position_loss.png").is_file()


def test_the_runs_haystack_is_its_held_out_text_and_an_oracle_scores_one(tiny_run):
    from train.core.runs import load_run
    from train.experiments.long_eval import haystack_tokens

    config, tokenizer = load_run(tiny_run)
    haystack = haystack_tokens(config, tokenizer, 500, seed=case_seed(7))
    assert haystack.size >= 500 and tokenizer.eos_id not in haystack
    words = set(TOKENIZER.decode(haystack).split())
    assert {"def", "return"} & words
    scores = retrieval_accuracy(oracle(), tokenizer.encode, haystack, task="needle_multiquery",
                                lengths=(400,), depths=(0.5,), num_samples=3, seed=1)
    assert scores == [[1.0]]


def test_suite_long_mistakes_are_one_line_errors(tiny_run, capsys):
    from train.cli.entry import main

    assert main(["eval", str(tiny_run), "--suite", "long", "--seq-len", "32"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --seq-len"), err
    for bad in (["--depths", "0,2"], ["--tasks", "passkey,nope"], ["--lengths", "1,x"],
                ["--seed", "-1"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["eval", str(tiny_run), "--suite", "long", *bad])
        assert exit_info.value.code == 2
        assert "error:" in capsys.readouterr().err
