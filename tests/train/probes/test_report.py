"""`python -m train probe plot`: one PNG with every seed's final accuracy of the probe.json files
given (or found one level down in a folder); mistakes give one `error:` line and exit 2."""

import json

from train.cli.entry import main


def write_result(folder, task, finals, threshold=0.95):
    folder.mkdir(parents=True)
    methods = {m: {"final_accuracy": f, "successes": sum(a > threshold for a in f),
                   "seeds": len(f)} for m, f in finals.items()}
    (folder / "probe.json").write_text(json.dumps(
        {"task": task, "threshold": threshold, "methods": methods}))


def one_error(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: probe plot: "), err
    return err[0]


def test_probe_plot_draws_every_result_of_a_folder(tmp_path, capsys):
    write_result(tmp_path / "a", "ladder", {"fpa": [1.0, 0.9, 0.97], "fox": [0.5, 0.96, 0.2]})
    write_result(tmp_path / "b", "copy", {"fpa": [0.3, 0.99]})
    (tmp_path / "c").mkdir()                             # no probe.json: not a result
    out = tmp_path / "plots" / "seeds.png"
    assert main(["probe", "plot", str(tmp_path), f"out={out}", "columns=2"]) == 0
    assert "2 results" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["probe", "plot", str(tmp_path / "b" / "probe.json")]) == 0   # one file
    assert (tmp_path / "b" / "per_seed.png").is_file()


def test_probe_plot_mistakes_give_one_error_line(tmp_path, capsys):
    assert main(["probe", "plot", str(tmp_path)]) == 2
    assert "no probe.json" in one_error(capsys)
    assert main(["probe", "plot", str(tmp_path / "missing")]) == 2
    assert "does not exist" in one_error(capsys)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "probe.json").write_text("{\"task\": 1}")
    assert main(["probe", "plot", str(tmp_path)]) == 2
    assert "is not a probe result" in one_error(capsys)
    assert main(["probe", "plot", str(tmp_path), "colums=2"]) == 2
    assert "unknown key 'colums'" in one_error(capsys)
    assert main(["probe", "plot", str(tmp_path), "columns=0"]) == 2
    assert "columns" in one_error(capsys)
    assert main(["probe", "plot"]) == 2
    one_error(capsys)
