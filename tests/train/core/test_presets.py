"""Presets and overrides (train/core/presets.py): a small train.steps scales the preset's
warm-up down with a `note:` line instead of failing."""





def test_a_small_train_steps_scales_the_presets_warmup_with_a_note(capsys):
    from train.cli.entry import main

    assert main(["config", "tiny_fpa", "train.steps=5"]) == 0     # tiny: warm-up 30 of 600
    captured = capsys.readouterr()
    assert "  warmup_steps: 0\n" in captured.out and "  steps: 5\n" in captured.out
    notes = captured.err.splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: optim.warmup_steps=30"), notes
    assert "train.steps=5" in notes[0] and "scaled down to 0" in notes[0]

    assert main(["config", "tiny_fpa", "train.steps=300"]) == 0    # fits: unchanged
    captured = capsys.readouterr()
    assert "  warmup_steps: 30\n" in captured.out and captured.err == ""
    assert main(["config", "tiny_fpa", "train.steps=5", "optim.warmup_steps=5"]) == 2
    err = capsys.readouterr().err.splitlines()                     # explicit: refused
    assert len(err) == 1 and err[0].startswith("error: optim.warmup_steps=5 must be < "
                                               "train.steps=5"), err
