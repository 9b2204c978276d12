"""A stage chain stays consistent across re-runs (train/experiments/stages.py).

One chain is trained once per module, in this process: a 1-layer GDN reference (2 steps) and
stages a (16 -> 32) and b (32 -> 64) of 2 steps each (`train.steps=2` on the command line).
Each test works on a copy of it.

    changed steps   `stages ... train.steps=4` (or 1, or `--stage a train.steps=4`) would move
                    stage a's end while b was started from a at step 2: refused with one
                    `error:` line naming the stages and the steps, and nothing is changed
    edge signals    SIGTERM after a stage's last step leaves its final checkpoint without its
                    final eval (simulated: the eval records at that step are dropped from
                    metrics.jsonl, which is exactly what such a stop leaves); a re-run
                    completes the eval (no training step) and prints the stage's summary.
                    SIGTERM right after stage a finished (raised as the CLI's handler does,
                    when stage b starts): a's summary has been printed already. A re-run names a
                    finished stage's final eval loss.
"""

import json
import shutil
from pathlib import Path

import pytest

from tests.seeds import case_seed
from tests.train.experiments.test_stages import GDN, STAGE, write_corpus
from train.cli import EXIT_PREEMPTED
from train.cli.entry import Terminated, main
from train.core.metrics import read_metrics
from train.core.runs import checkpoint_steps


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """(root, curriculum path, out dir) of a finished chain a, b at train.steps=2."""
    from train.core.fit import fit
    from train.core.presets import load_config
    from train.experiments.stages import load_curriculum, run_curriculum

    root = tmp_path_factory.mktemp("chain")
    corpus = write_corpus(root / "corpus", case_seed(3001))
    common = GDN + [f"data.source={corpus}", "train.tensorboard=false"]
    reference = root / "reference"
    # the stages' optimizer (SGD) for the reference too: its init program is theirs (compiled
    # once); which optimizer trained the reference plays no part in what these tests check
    fit(load_config(None, common + STAGE + ["train.steps=2"]), reference)
    curriculum = root / "curriculum.yaml"
    curriculum.write_text(json.dumps({
        "config": "tiny_gdn", "reference": str(reference), "overrides": common + STAGE,
        "stages": [{"name": "a", "overrides": ["cpt.l_tar=32"]},
                   {"name": "b", "overrides": ["cpt.l_ref=32", "cpt.l_tar=64"]}]}))
    out = root / "out"
    results = run_curriculum(load_curriculum(str(curriculum)), out, overrides=("train.steps=2",),
                             report=lambda line: None)
    assert [(name, r.steps, r.preempted) for name, r in results] == [("a", 2, False),
                                                                    ("b", 2, False)]
    return root, curriculum, out


def copied(chain, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(chain[2], out)
    return out


def snapshot(out: Path) -> dict:
    """What a refusal must leave unchanged: each stage's checkpoints, config and metrics."""
    return {name: (checkpoint_steps(out / name), (out / name / "config.json").read_text(),
                   (out / name / "metrics.jsonl").read_text()) for name in ("a", "b")}


def drop_final_eval(run_dir: Path, step: int) -> None:
    """metrics.jsonl as a SIGTERM after the last step leaves it: no eval record at `step`."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    kept = [line for line in lines
            if not (json.loads(line)["kind"] == "eval" and json.loads(line)["step"] == step)]
    assert len(kept) == len(lines) - 1
    path.write_text("".join(line + "\n" for line in kept))


def final_evals(run_dir: Path, step: int) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["kind"] == "eval" and r["step"] == step]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err), err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("arguments, expected", [
    (["train.steps=4"], ["stage 'b' was started from stage 'a' at step 2",
                         "stage 'a' now ends at step 4"]),
    (["--stage", "a", "train.steps=4"], ["stage 'b' was started from stage 'a' at step 2",
                                         "stage 'a' now ends at step 4"]),
    (["train.steps=1"], ["stage 'a' already ran to step 2", "train.steps=1"]),
], ids=["longer", "only-a-longer", "shorter"])
@pytest.mark.slow
def test_changed_steps_are_refused_and_leave_the_chain_unchanged(chain, tmp_path, capsys,
                                                                 arguments, expected):
    _, curriculum, _ = chain
    out = copied(chain, tmp_path)
    before = snapshot(out)
    capsys.readouterr()
    assert main(["stages", str(curriculum), "--out", str(out), *arguments]) == 1
    error = one_error_line(capsys)
    assert all(part in error for part in expected), error
    assert "--out" in error, error      # says how to go on: another --out directory
    assert snapshot(out) == before
    # the unchanged command still finds the chain finished
    assert main(["stages", str(curriculum), "--out", str(out), "train.steps=2"]) == 0
    assert snapshot(out) == before


@pytest.mark.slow
def test_rerun_completes_a_final_eval_cut_off_by_a_signal(chain, tmp_path, capsys):
    _, curriculum, _ = chain
    out = copied(chain, tmp_path)
    losses = {name: final_evals(out / name, 2)[0]["loss"] for name in ("a", "b")}
    for name in ("a", "b"):
        drop_final_eval(out / name, 2)
    capsys.readouterr()
    assert main(["stages", str(curriculum), "--out", str(out), "train.steps=2"]) == 0
    printed = capsys.readouterr().out
    for name in ("a", "b"):
        evals = final_evals(out / name, 2)
        assert len(evals) == 1 and evals[0]["loss"] == pytest.approx(losses[name], rel=1e-5)
        assert checkpoint_steps(out / name) == [2]
        assert f"stage {name}:\n" in printed, printed              # its summary table
        # no training step was run again: the train records are the original two
        assert [r["step"] for r in read_metrics(out / name) if r["kind"] == "train"] == [1, 2]
    assert printed.count("eval loss") >= 2, printed

    # run again: both finished; each line names the final eval loss
    assert main(["stages", str(curriculum), "--out", str(out), "train.steps=2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "finished" in line]
    assert len(lines) == 2, lines
    for line, name in zip(lines, ("a", "b")):
        assert line.startswith(f"stage {name}: finished") and \
            f"eval loss {losses[name]:.4f}" in line, line


@pytest.mark.slow
def test_summary_of_a_finished_stage_survives_a_sigterm_before_the_next(chain, tmp_path,
                                                                       capsys, monkeypatch):
    import train.experiments.stages

    _, curriculum, _ = chain
    out = copied(chain, tmp_path)
    for name in ("a", "b"):             # a fresh chain: stage a trains in this run
        shutil.rmtree(out / name)
    original = train.experiments.stages.continued_pretraining

    def sigterm_when_b_starts(config, run_dir):
        if Path(run_dir).name == "b":
            raise Terminated            # what the CLI's SIGTERM handler raises outside fit
        return original(config, run_dir)

    monkeypatch.setattr(train.experiments.stages, "continued_pretraining", sigterm_when_b_starts)
    capsys.readouterr()
    assert main(["stages", str(curriculum), "--out", str(out), "train.steps=2"]) == EXIT_PREEMPTED
    printed = capsys.readouterr().out
    assert "stage a:\n" in printed and "eval loss" in printed, printed
    assert len(final_evals(out / "a", 2)) == 1
