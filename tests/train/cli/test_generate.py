"""`python -m train generate` (train/cli/generate.py): out-of-range values refused naming the
range (exit 2, as argparse does), the edges accepted, a header per sample, every default in
--help."""

import argparse

import pytest

from tests.train import tiny_run
from train.cli.entry import build_parser, main


def one_error_line(text):
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


@pytest.mark.parametrize("option,value,valid", [
    ("--max-new-tokens", "0", ">= 1"),
    ("--max-new-tokens", "-3", ">= 1"),
    ("--batch", "0", ">= 1"),
    ("--top-k", "-1", ">= 0"),
    ("--top-p", "0", "(0, 1]"),
    ("--top-p", "1.5", "(0, 1]"),
    ("--temperature", "-1", ">= 0"),
    ("--evict-below", "0.5", "<= 0"),
    ("--evict-below", "1e-9", "<= 0"),
])
def test_generate_refuses_out_of_range_values_naming_the_range(tmp_path, capsys, option, value,
                                                              valid):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", str(tmp_path), "--prompt", "x", option, value])
    assert exit_info.value.code == 2
    line = one_error_line(capsys.readouterr().err)
    assert option in line and valid in line and value in line, line


def test_generate_accepts_the_edges_of_the_ranges(tmp_path):
    args = build_parser().parse_args(
        ["generate", str(tmp_path), "--prompt", "x", "--max-new-tokens", "1", "--top-k", "0",
         "--top-p", "1", "--temperature", "0", "--evict-below", "0"])
    assert (args.max_new_tokens, args.top_k, args.top_p, args.temperature,
            args.evict_below) == (1, 0, 1.0, 0.0, 0.0)
    assert build_parser().parse_args(["generate", "r", "--prompt", "x", "--evict-below",
                                      "none"]).evict_below is None


def test_every_sample_of_a_batch_has_a_header(tiny_trained_run, tmp_path, capsys):
    run_dir = tiny_run.copy_run(tiny_trained_run, tmp_path / "run")
    capsys.readouterr()
    argv = ["generate", str(run_dir), "--prompt", "def", "--max-new-tokens", "3"]
    assert main([*argv, "--batch", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    headers = [line for line in lines if line.startswith("--- sample")]
    assert headers == ["--- sample 0", "--- sample 1"], lines
    assert lines[0] == "--- sample 0" and lines[1].startswith("def")
    assert main(argv) == 0                          # one sample: no header
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("def") and not any(line.startswith("---") for line in lines)


def subcommand(name):
    return build_parser()._subparsers._group_actions[0].choices[name]


def help_of(parser):
    return " ".join(parser.format_help().split())


def test_generate_help_shows_every_default():
    parser = subcommand("generate")
    text = help_of(parser)
    for action in parser._actions:
        if action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            continue
        assert f"default: {action.default})" in text, action.option_strings


def test_long_context_warning_sizes_the_key_value_caches_of_the_attention_layers():
    """Far beyond data.seq_len the warning names the key-value caches (2 H Dh values per token
    of every attention layer, at a power of two of slots), or the fixed-size recurrent state
    of a model without them; within LONG_CONTEXT_FACTOR x seq_len, nothing."""
    from train.cli.generate import LONG_CONTEXT_FACTOR, _long_context_warning
    from train.core.presets import load_config
    from train.generate.driver import planned_capacity

    hybrid = load_config("tiny_hybrid", ["data.seq_len=64", "model.dtype=float32"])
    a, trained = hybrid.attention, LONG_CONTEXT_FACTOR * 64
    assert _long_context_warning(hybrid, 2, trained - 8, 8) is None
    warning = _long_context_warning(hybrid, 2, trained, 8)
    attention_layers = hybrid.layer_sections().count("attention")
    slots = planned_capacity(trained + 8, 0, headroom=0, fresh=True)
    mib = attention_layers * 2 * slots * a.num_heads * 2 * a.head_dim * 4 / 2**20
    assert warning.startswith("warning: prompt") and (
        f"up to {slots} slots per head in {attention_layers} layer(s), about {mib:,.1f} MiB"
        in warning), warning
    gdn = load_config("tiny_fpa", ["model.pattern=G", "data.seq_len=64"])
    assert _long_context_warning(gdn, 1, trained, 8).endswith(
        "the Gated DeltaNet state stays its fixed size")
