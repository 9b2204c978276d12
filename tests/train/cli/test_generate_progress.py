"""`python -m train generate` says what it is doing on stderr: a line before and after a long
prefill, one `warning:` line when the prompt plus the new tokens reach far beyond the training
length (with the cache size), and SIGTERM exits 130."""

import os
import signal

import pytest

from tests.train.tiny_run import copy_run


def stderr_lines(capsys):
    return capsys.readouterr().err.splitlines()


@pytest.fixture(scope="module")
def run_dir(tiny_trained_run, tmp_path_factory):
    return copy_run(tiny_trained_run, tmp_path_factory.mktemp("progress") / "run")


@pytest.mark.slow
def test_generate_reports_a_long_prefill_and_warns_far_beyond_the_training_length(
        run_dir, capsys):
    from train.cli.entry import main

    capsys.readouterr()
    base = ["generate", str(run_dir), "--max-new-tokens", "2", "--temperature", "0"]
    assert main([*base, "--prompt", "x" * 600]) == 0                   # trained at 16 tokens
    lines = stderr_lines(capsys)
    assert lines[1].startswith("warning: prompt (600 tokens) + --max-new-tokens 2 = 602 "
                               "tokens"), lines
    # 1 softmax layer, 2 heads of 8, float32, 1024 slots: 1024 * 2 * 2 * 8 * 4 bytes = 0.125 MiB
    assert "data.seq_len=16" in lines[1] and "1024 slots per head in 1 layer(s)" in lines[1]
    assert "about 0.1 MiB" in lines[1]
    assert lines[2] == "prefilling the 600-token prompt (1 row(s))..."
    assert lines[3].startswith("prefilled in ") and len(lines) == 4, lines

    assert main([*base, "--prompt", "def", "--max-new-tokens", "62"]) == 0   # 65 > 4 x 16
    lines = stderr_lines(capsys)
    assert len(lines) == 2 and lines[1].startswith("warning: prompt (3 tokens)"), lines
    assert main([*base, "--prompt", "def", "--max-new-tokens", "61"]) == 0   # 64: fine
    assert len(stderr_lines(capsys)) == 1


def test_generate_stopped_by_sigterm_exits_130(run_dir, capsys, monkeypatch):
    from train.cli.entry import main
    from train.generate.driver import Generator

    def terminated(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Generator, "generate", terminated)
    previous = signal.getsignal(signal.SIGTERM)
    assert main(["generate", str(run_dir), "--prompt", "def"]) == 130
    assert stderr_lines(capsys)[-1] == "error: stopped by SIGTERM (nothing to resume)"
    assert signal.getsignal(signal.SIGTERM) is previous
