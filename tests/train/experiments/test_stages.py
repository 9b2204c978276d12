"""Staged SpectralShift extension end to end (train/experiments/stages.py,
train/experiments/cpt.py), in a subprocess: a 1-layer GDN reference at context 16, then stages
a (16 -> 32) and b (32 -> 64). Stage a is stopped by SIGTERM after 2 of its 4 steps and the
same curriculum run again: a resumes without shifting again, b shifts relative to a's final
checkpoint. Every train step of a stage probes the optimizer the step uses (SGD, so an all-ones
gradient gives update = -lr of the group; one jitted update per session): alpha / default
update = s of that stage at every step, resumed steps included. Then the one-line refusals of a
stage whose reference is missing or unfinished, and `spectra --compare` on the finished runs.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]

# one context length (16) for every run, so one compiled step serves them all; the stages
# extend it nominally (cpt.l_ref / cpt.l_tar), which is all the shift and the scale depend on
GDN = ["data.seq_len=16", "model.d_model=32", "model.num_layers=1", "model.pattern=G",
       "gdn.num_heads=2", "gdn.head_dim=16", "gdn.implementation=reference", "data.batch_size=2",
       "data.heldout_fraction=0.2", "train.eval_batches=1", "train.log_every=1",
       "train.tensorboard=false", "optim.warmup_steps=0", "optim.schedule=constant"]
# SGD without weight decay at a negligible learning rate: the weights stay where the shift put
# them (to ~1e-9), while the probe still sees each group's learning rate exactly
STAGE = ["optim.name=sgd", "optim.lr=1e-9", "optim.weight_decay=0", "train.checkpoint_every=2",
         "train.keep_checkpoints=10"]

DRIVER = textwrap.dedent("""
    import json, os, signal, sys
    import jax, jax.numpy as jnp, numpy as np
    options = json.loads(sys.argv[1])
    from train.core import fit
    from train.core.presets import load_config
    from train.experiments.stages import load_curriculum, run_curriculum

    original_build, calls = fit.build_session, [0]

    def build_session(config, *args, **kwargs):
        session = original_build(config, *args, **kwargs)
        step_fn = session.train_step
        # one compiled program per session (op by op, the update compiled dozens of small ones)
        probe = jax.jit(lambda params, opt_state: session.optimizer.update(
            jax.tree.map(jnp.ones_like, params), opt_state, params)[0])

        def train_step(state, batch):
            if config.train.run_dir:   # a stage's step (the reference's run_dir is not set)
                mixer = probe(state["params"], state["opt_state"])["layers_0"]["mixer"]
                ratio = float(mixer["a_proj"]["kernel"].ravel()[0]
                              / mixer["q_proj"]["kernel"].ravel()[0])
                with open(options["probe"], "a") as f:
                    f.write(json.dumps({"run": config.train.run_dir, "step": int(state["step"]),
                                        "ratio": ratio}) + "\\n")
            calls[0] += 1
            out = step_fn(state, batch)
            if calls[0] == options.get("sigterm_after_steps"):
                os.kill(os.getpid(), signal.SIGTERM)
            return out

        session.train_step = train_step
        return session

    fit.build_session = build_session
    fit.fit(load_config(None, options["reference"]["overrides"]), options["reference"]["run_dir"])
    for phase in options["phases"]:   # run the curriculum, or the CLI: in this process
        if phase == "curriculum":
            results = run_curriculum(load_curriculum(options["curriculum"]), options["out"])
            print("RESULT " + json.dumps({name: None if r is None else
                                          {"start_step": r.start_step, "steps": r.steps,
                                           "preempted": r.preempted} for name, r in results}))
        else:
            import contextlib, io
            from train.cli.entry import main
            error = io.StringIO()
            with contextlib.redirect_stderr(error):
                rc = main(phase)
            print("RESULT " + json.dumps({"rc": rc, "stderr": error.getvalue()}), flush=True)
""")


def run_driver(environment, **options):
    completed = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(options)], cwd=REPO,
                               env=environment, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return [json.loads(line[len("RESULT "):]) for line in completed.stdout.splitlines()
            if line.startswith("RESULT ")]


def write_corpus(root: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    words = ["def", "return", "for", "in", "if", "x", "y", "(", ")", ":", "=", "+", "1", "\n"]
    root.mkdir()
    for index in range(12):
        (root / f"doc_{index}.py").write_text(" ".join(rng.choice(words, size=int(rng.integers(80, 300)))))
    return root


def alpha_kernel(run_dir):
    from train.core.runs import load_run, restore_run_state
    from train.core.session import build_session

    config, tokenizer = load_run(run_dir)
    restored = restore_run_state(run_dir, build_session(config, tokenizer.vocab_size))
    return np.asarray(restored.state["params"]["layers_0"]["mixer"]["a_proj"]["kernel"]), restored


def shifted(weight, s):
    mu = weight.mean()
    return mu + s * (weight - mu)


@pytest.mark.slow
def test_staged_extension_shifts_once_per_stage(tmp_path, environment):
    from tests.seeds import case_seed
    from train.cli.entry import main

    corpus = write_corpus(tmp_path / "corpus", case_seed(1401))
    common = GDN + [f"data.source={corpus}"]
    reference = tmp_path / "reference"
    curriculum = tmp_path / "curriculum.yaml"
    curriculum.write_text(json.dumps({
        "config": "tiny_gdn", "reference": str(reference), "overrides": common + STAGE,
        "stages": [{"name": "a", "overrides": ["cpt.l_tar=32", "train.steps=4"]},
                   {"name": "b", "overrides": ["cpt.l_ref=32", "cpt.l_tar=64", "train.steps=2"]}]}))
    out, probe = tmp_path / "stages", tmp_path / "probe.jsonl"

    # in one process: the reference (2 steps); the curriculum, whose stage a is stopped by
    # SIGTERM after its 2nd step; stage b alone, refused: it extends a, which is unfinished
    # (ambiguous), and in a fresh directory a is missing; the same curriculum again
    cli = [["stages", str(curriculum), "--out", str(out_dir), "--stage", "b"]
           for out_dir in (out, tmp_path / "fresh")]
    first, ambiguous, missing, second = run_driver(
        environment, probe=str(probe), curriculum=str(curriculum), out=str(out),
        sigterm_after_steps=4, phases=["curriculum", *cli, "curriculum"],
        reference={"run_dir": str(reference), "overrides": common + ["train.steps=2"]})
    assert first == {"a": {"start_step": 0, "steps": 2, "preempted": True}}
    for refused, expected in [(ambiguous, ("ambiguous",)),
                              (missing, ("not a run directory", "does not exist"))]:
        error = refused["stderr"]
        assert refused["rc"] == 1 and error.startswith("error: ") and error.count("\n") == 1
        assert any(e in error for e in expected) and "stage 'b' extends stage 'a'" in error, error
    assert second == {"a": {"start_step": 2, "steps": 4, "preempted": False},
                      "b": {"start_step": 0, "steps": 2, "preempted": False}}

    # applied once per stage: a = shift(reference), b = shift(a's final), not shift(shift(...))
    s_a, s_b = (16 / 32) ** 0.5, (32 / 64) ** 0.5
    w_ref, _ = alpha_kernel(reference)
    w_a, restored_a = alpha_kernel(out / "a")
    w_b, restored_b = alpha_kernel(out / "b")
    np.testing.assert_allclose(w_a, shifted(w_ref, s_a), atol=1e-6)
    np.testing.assert_allclose(w_b, shifted(w_a, s_b), atol=1e-6)
    assert np.abs(w_b - w_a).max() > 1e-4 and np.abs(w_a - w_ref).max() > 1e-4
    markers_a = restored_a.record["extra"]["spectral_shift_applied"]
    markers_b = restored_b.record["extra"]["spectral_shift_applied"]
    assert [(m["l_ref"], m["l_tar"]) for m in markers_a] == [(16, 32)]
    assert [(m["l_ref"], m["l_tar"]) for m in markers_b] == [(16, 32), (32, 64)]
    assert markers_b[1]["reference"] == str((out / "a").resolve()) and markers_b[1]["reference_step"] == 4

    # the alpha learning-rate scale at every step of each stage, the resumed ones included
    records = [json.loads(line) for line in probe.read_text().splitlines()]
    by_run = {}
    for record in records:
        by_run.setdefault(Path(record["run"]).name, []).append(record)
    assert set(by_run) == {"a", "b"}
    assert [r["step"] for r in by_run["a"]] == [0, 1, 2, 3]
    assert [r["step"] for r in by_run["b"]] == [0, 1]
    np.testing.assert_allclose([r["ratio"] for r in by_run["a"]], s_a, rtol=1e-6)
    np.testing.assert_allclose([r["ratio"] for r in by_run["b"]], s_b, rtol=1e-6)

    # re-running a finished curriculum does nothing; spectra compares the reference with b
    from train.experiments.stages import load_curriculum, run_curriculum

    assert run_curriculum(load_curriculum(str(curriculum)), out, report=lambda line: None) \
        == [("a", None), ("b", None)]
    assert main(["spectra", str(reference), "--compare", str(out / "b"), "--lengths", "32", "60",
                 "--needle-position", "20", "--samples", "2", "--out", str(tmp_path / "sp")]) == 0
    report = json.loads((tmp_path / "sp" / "spectra.json").read_text())
    assert [r["step"] for r in report["runs"]] == [2, 2]
    assert report["runs"][0]["distances"] == [11, 39]
    for name in ("slow_band.png", "spectrum_layers_0.png", "compare_layers_0.png"):
        assert (tmp_path / "sp" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "stages").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_shipped_curriculum_plans(path, tmp_path):
    """Each preset curriculum parses and every stage's config validates (nothing runs)."""
    from train.experiments.stages import load_curriculum, plan
    curriculum = load_curriculum(str(path))
    planned = plan(curriculum, tmp_path, reference=str(tmp_path / "pretrained"))
    assert [p.stage.name for p in planned] == [s.name for s in curriculum.stages]
