"""`python -m train export` on a tiny trained run: `--out` naming a file, a second export into
the same directory and a directory holding the user's files are one `error:` line each (exit 1)
unless --force; config.json says `dtype` (not the deprecated `torch_dtype`) and carries the
tokenizer's special-token ids, which generation_config.json repeats; the command's arguments
and a missing run."""

import json

import pytest

from tests.train import tiny_run
from train.cli.entry import build_parser, main
from train.cli.export import command_export
from train.data.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def run_dir(tiny_trained_run, tmp_path_factory):
    return tiny_run.copy_run(tiny_trained_run, tmp_path_factory.mktemp("export_overwrite") / "run")


def one_error_line(capsys):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_out_naming_a_file_is_one_error_line(run_dir, tmp_path, capsys):
    target = tmp_path / "model.bin"
    target.write_text("the user's file")
    assert main(["export", str(run_dir), "--out", str(target)]) == 1
    line = one_error_line(capsys)
    assert "--out" in line and str(target) in line and "Traceback" not in line
    assert target.read_text() == "the user's file"


def test_a_second_export_into_the_same_directory_needs_force(run_dir, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    weights = (out / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", str(out), "--dtype", "bf16"]) == 1
    line = one_error_line(capsys)
    assert str(out) in line and "--force" in line
    assert (out / "model.safetensors").read_bytes() == weights          # untouched
    assert main(["export", str(run_dir), "--out", str(out), "--dtype", "bf16", "--force"]) == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert (out / "model.safetensors").read_bytes() != weights


def test_a_directory_of_the_users_files_is_refused_and_kept_with_force(run_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["export", str(run_dir), "--out", str(out)]) == 1
    assert "--force" in one_error_line(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]       # nothing written
    assert main(["export", str(run_dir), "--out", str(out), "--force"]) == 0
    assert (out / "notes.txt").read_text() == "keep me"
    assert (out / "model.safetensors").is_file()


def test_config_says_dtype_and_the_tokenizers_special_ids(run_dir, tmp_path):
    out = tmp_path / "export"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    # The byte tokenizer defines an end-of-text token only: no BOS, no padding token.
    eos = ByteTokenizer.eos_id
    assert config["eos_token_id"] == eos
    assert "bos_token_id" not in config and "pad_token_id" not in config
    assert json.loads((out / "generation_config.json").read_text()) == {"eos_token_id": eos}
    readme = (out / "README.md").read_text()
    assert "eos_token_id" in readme and "no BOS" in readme


def test_force_is_documented_in_the_help_and_the_readme():
    from tests.devices import REPO

    export = build_parser()._subparsers._group_actions[0].choices["export"]
    text = " ".join(export.format_help().split())
    assert "--force" in text and "non-empty" in text
    readme = (REPO / "README.md").read_text()
    assert "python -m train export" in readme and "--force" in readme


def test_cli_parses_export_and_reports_a_missing_run(tmp_path, capsys):
    args = build_parser().parse_args(["export", str(tmp_path / "no-run"), "--format", "fla",
                                      "--out", str(tmp_path / "out"), "--dtype", "bf16",
                                      "--step", "7"])
    assert (args.handler, args.dtype, args.step, args.format) == (command_export, "bf16", 7, "fla")
    assert command_export(args) == 1
    assert capsys.readouterr().err.startswith(
        f"error: {tmp_path / 'no-run'}: run directory does not exist")
