"""Staged context extension: a chain of SpectralShift continued-pretraining runs
(train/experiments/cpt.py).

A curriculum (configs/stages/NAME.yaml):

    config: gdn_tiny_cpt            preset of every stage (cpt section, optimizer, ...)
    reference: runs/tiny_gdn        the pretrained run stage 1 extends (--reference overrides)
    overrides: [key=value, ...]     for every stage (optional)
    stages:
      - name: len1024               a directory name: [A-Za-z0-9_.-]+
        overrides: [data.seq_len=1024, train.steps=100]
      - name: len2048
        overrides: [data.seq_len=2048]

    stage i runs in OUT/<name_i> with cpt.reference = OUT/<name_{i-1}> (stage 1: `reference`),
    i.e. it starts from the previous stage's final checkpoint and shifts relative to it
    (l_ref = that stage's seq_len). Every stage's config is loaded and checked before anything
    runs. Running the curriculum again skips finished stages (a checkpoint at train.steps and
    the eval of that step recorded), resumes an interrupted one (its marker says the shift is
    applied: not again; one stopped right after its last step only runs its final eval) and
    goes on. --stage NAME runs that stage only; its reference must be finished, else refused.
    Each stage's summary is printed as soon as it is done (a signal before the next stage
    cannot lose it); a finished stage's line names its final eval loss.

    The chain must stay one chain: before anything runs, a stage directory is refused (one
    `error:` line, nothing changed) when it ran past its train.steps, or when it was started
    from a step of its reference other than the one the chain now extends (its marker's
    reference_step vs cpt.reference_step, else the reference's final step: the previous
    stage's train.steps, or the curriculum reference's). E.g. `train.steps=8` after a chain
    ran at 6: stage 1 would grow to 8 under a stage 2 made from its step 6. Use another --out.

`cpt.reference` and `train.run_dir` are set by the runner, so they may not appear in overrides.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from train.checkpoint.manager import Checkpointer, UnreadableCheckpointError
from train.core.config import Config, ConfigError
from train.core.fit import RunSetupError
from train.core.metrics import MetricsFileError, read_metrics
from train.core.presets import CONFIG_DIR, load_config
from train.core.runs import DEFAULT_RUNS_DIR, checkpoint_dir, checkpoint_steps
from train.experiments.cpt import (applied_markers, continued_pretraining, load_reference,
                                   reference_checkpoint_step)

STAGES_DIR = CONFIG_DIR / "stages"
STAGE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
RUNNER_KEYS = ("cpt.reference", "train.run_dir")


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    overrides: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Curriculum:
    name: str
    config: str                     # preset name or YAML path, for every stage
    reference: str                  # the run stage 1 extends
    overrides: tuple[str, ...]      # for every stage
    stages: tuple[Stage, ...]


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of key=value strings, got {value!r}")
    for item in value:
        if item.partition("=")[0].strip() in RUNNER_KEYS:
            raise ConfigError(f"{where}: {item!r}: the stage runner sets {' and '.join(RUNNER_KEYS)}")
    return tuple(value)


def resolve_curriculum(path_or_name: str) -> Path:
    """A YAML path, or NAME / NAME.yaml in configs/stages/."""
    candidate = Path(path_or_name)
    if candidate.is_file():
        return candidate
    for name in (path_or_name, f"{path_or_name}.yaml"):
        if (STAGES_DIR / name).is_file():
            return STAGES_DIR / name
    available = ", ".join(sorted(p.stem for p in STAGES_DIR.glob("*.yaml")))
    raise ConfigError(f"curriculum {path_or_name!r}: no such file or preset in configs/stages "
                      f"(available: {available})")


def load_curriculum(path_or_name: str) -> Curriculum:
    """Parse and check a curriculum file (module doc); ConfigError naming the key otherwise."""
    path = resolve_curriculum(path_or_name)
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    unknown = sorted(set(raw) - {"config", "reference", "overrides", "stages"})
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (valid: config, reference, "
                          f"overrides, stages)")
    if not isinstance(raw.get("config"), str) or not raw["config"]:
        raise ConfigError(f"{path}: config: name the preset every stage uses")
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise ConfigError(f"{path}: stages: expected a non-empty list of {{name, overrides}}")
    stages = []
    for index, item in enumerate(stages_raw):
        where = f"{path}: stages[{index}]"
        if not isinstance(item, dict) or set(item) - {"name", "overrides"}:
            raise ConfigError(f"{where}: expected a mapping with keys name and overrides, got {item!r}")
        name = item.get("name")
        if not isinstance(name, str) or not STAGE_NAME.fullmatch(name):
            raise ConfigError(f"{where}.name: expected a directory name ([A-Za-z0-9_.-]+), got {name!r}")
        if name in {s.name for s in stages}:
            raise ConfigError(f"{where}.name: {name!r} is used by an earlier stage")
        stages.append(Stage(name, _strings(item.get("overrides"), f"{where}.overrides")))
    reference = raw.get("reference") or ""
    if not isinstance(reference, str):
        raise ConfigError(f"{path}: reference: expected a run directory, got {reference!r}")
    return Curriculum(name=path.stem, config=raw["config"], reference=reference,
                      overrides=_strings(raw.get("overrides"), f"{path}: overrides"),
                      stages=tuple(stages))


@dataclasses.dataclass(frozen=True)
class PlannedStage:
    stage: Stage
    run_dir: Path
    reference: Path
    config: Config


def plan(curriculum: Curriculum, out_dir: str | Path, overrides: tuple[str, ...] = (),
         reference: str | None = None) -> list[PlannedStage]:
    """Every stage's run directory, reference and validated config (nothing runs)."""
    out_dir = Path(out_dir)
    previous = reference or curriculum.reference
    if not previous:
        raise ConfigError(f"curriculum {curriculum.name}: no reference run (set `reference:` in "
                          f"the file or pass --reference)")
    _strings(list(overrides), "overrides")
    planned = []
    for stage in curriculum.stages:
        run_dir = out_dir / stage.name
        config = load_config(curriculum.config, [*curriculum.overrides, *stage.overrides,
                                                 *overrides, f"cpt.reference={previous}",
                                                 f"train.run_dir={run_dir}"])
        planned.append(PlannedStage(stage, run_dir, Path(previous), config))
        previous = str(run_dir)
    for before, after in zip(planned, planned[1:]):
        if target_length(after.config) <= target_length(before.config):
            raise ConfigError(f"stage {after.stage.name!r}: its length {target_length(after.config)} "
                              f"must exceed stage {before.stage.name!r}'s "
                              f"{target_length(before.config)} (each stage extends the previous "
                              f"one; cpt.l_tar, else data.seq_len)")
    return planned


def target_length(config: Config) -> int:
    return config.cpt.l_tar or config.data.seq_len


def final_eval(planned: PlannedStage) -> dict[str, Any] | None:
    """The eval record of the stage's final step (train.steps), None if there is none (a
    signal after the last step saves the final checkpoint but stops before this eval)."""

    try:
        records = read_metrics(planned.run_dir)
    except (FileNotFoundError, MetricsFileError):   # the stage's own run reports a damage
        return None
    return next((r for r in records
                 if r["kind"] == "eval" and r["step"] == planned.config.train.steps), None)


def finished(planned: PlannedStage) -> bool:
    """Its final checkpoint (train.steps) exists and the eval of that step is recorded."""
    return (planned.config.train.steps in checkpoint_steps(planned.run_dir)
            and final_eval(planned) is not None)


def _started_from(run_dir: Path) -> int | None:
    """The reference step that a stage's SpectralShift marker records (newest readable
    checkpoint record); None if none says (the stage's own run reports unreadable ones)."""

    checkpointer = Checkpointer(checkpoint_dir(run_dir), read_only=True)
    try:
        for step in reversed(checkpointer.all_steps()):
            try:
                markers = applied_markers(checkpointer.read_record(step))
            except UnreadableCheckpointError:
                continue
            return markers[-1].get("reference_step") if markers else None
        return None
    finally:
        checkpointer.close()


def check_chain(planned: list[PlannedStage]) -> None:
    """Refuses (RunSetupError) a stage directory that would leave the chain mixed (module doc):
    checkpoints past its train.steps, or a start from another step of its reference than the
    one the chain now extends. Reads checkpoint records only; changes nothing."""

    advice = "use another --out directory for the changed chain"
    for index, stage in enumerate(planned):
        steps = checkpoint_steps(stage.run_dir)
        if not steps:
            continue
        name, end = stage.stage.name, stage.config.train.steps
        if steps[-1] > end:
            raise RunSetupError(
                f"stage {name!r} already ran to step {steps[-1]} ({stage.run_dir}), past its "
                f"train.steps={end}; {advice}, or keep train.steps={steps[-1]}")
        started = _started_from(stage.run_dir)
        if started is None:
            continue
        if index:
            what = f"stage {planned[index - 1].stage.name!r}"
            final = planned[index - 1].config.train.steps
        else:
            what = f"the curriculum's reference ({stage.reference})"
            try:
                final = load_reference(stage.reference)[0].train.steps
            except (RunSetupError, OSError, ValueError):
                continue        # the stage's own run refuses a reference that is not usable
        wanted = stage.config.cpt.reference_step or final
        if started != wanted:
            now = (f"cpt.reference_step is now {wanted}" if stage.config.cpt.reference_step
                   else f"{what} now ends at step {wanted} (its train.steps)")
            raise RunSetupError(
                f"stage {name!r} was started from {what} at step {started}, but {now}; "
                f"continuing would mix the two chains: {advice}, or keep {what} at step "
                f"{started}")


def run_curriculum(curriculum: Curriculum, out_dir: str | Path, *, overrides: tuple[str, ...] = (),
                   reference: str | None = None, only: str | None = None, report=print,
                   summarize=None):
    """Run the stages in order (or only `only`); returns [(stage name, FitResult or None if it
    was already finished)] up to the first stage stopped by a signal (result.preempted).
    `summarize(planned stage, result)` is called as soon as each stage that ran returns.
    Refuses a chain that a run would leave mixed before anything runs (check_chain)."""

    planned = plan(curriculum, out_dir, overrides, reference)
    names = [p.stage.name for p in planned]
    if only is not None and only not in names:
        raise ConfigError(f"--stage {only!r}: no such stage in {curriculum.name} (stages: {names})")
    check_chain(planned)
    results = []
    for index, stage in enumerate(planned):
        if only is not None and stage.stage.name != only:
            continue
        if finished(stage):
            report(f"stage {stage.stage.name}: finished ({stage.run_dir}, step "
                   f"{stage.config.train.steps}, eval loss {final_eval(stage)['loss']:.4f})")
            results.append((stage.stage.name, None))
            continue
        if not checkpoint_steps(stage.run_dir):
            what = (f"stage {names[index - 1]!r}" if index else "the curriculum's reference")
            try:
                reference_config, _ = load_reference(stage.reference)
                reference_checkpoint_step(stage.reference, reference_config,
                                          stage.config.cpt.reference_step)
            except RunSetupError as error:
                hint = "" if index else "; --reference names the run stage 1 extends"
                raise RunSetupError(f"stage {stage.stage.name!r} extends {what} "
                                    f"({stage.reference}), which is not usable: {error}{hint}"
                                    ) from None
        steps = checkpoint_steps(stage.run_dir)
        if stage.config.train.steps in steps:
            report(f"stage {stage.stage.name}: completing its final eval ({stage.run_dir}, step "
                   f"{stage.config.train.steps}: a signal stopped the run before it)")
        else:
            report(f"stage {stage.stage.name}: {'resuming' if steps else 'new'} run in "
                   f"{stage.run_dir} (reference {stage.reference}, seq_len "
                   f"{stage.config.data.seq_len})")
        result = continued_pretraining(stage.config, stage.run_dir)
        results.append((stage.stage.name, result))
        if summarize is not None:
            summarize(stage, result)
        if result.preempted:
            break
    return results


def default_out_dir(curriculum: Curriculum) -> Path:
    return DEFAULT_RUNS_DIR / curriculum.name
