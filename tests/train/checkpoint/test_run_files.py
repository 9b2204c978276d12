"""The files of a run beside its checkpoints (train/checkpoint/run_files.py)."""

import logging
import re

import pytest

from train.checkpoint.run_files import RunConfigError, load_run_config, save_run_files
from train.data.tokenizer import ByteTokenizer


def test_run_files_written_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="train.checkpoint.run_files")
    config = {"model": {"width": 64, "layers": (2, 3)}, "path": tmp_path}
    save_run_files(tmp_path, config=config, tokenizer=ByteTokenizer())
    save_run_files(tmp_path, config=config, tokenizer=ByteTokenizer())
    assert load_run_config(tmp_path) == {"model": {"width": 64, "layers": [2, 3]},
                                         "path": str(tmp_path)}
    assert (tmp_path / "tokenizer" / "tokenizer_meta.json").is_file()
    save_run_files(tmp_path, config={"model": {"width": 128}})
    assert load_run_config(tmp_path)["model"]["width"] == 64
    assert len(list(tmp_path.glob("config.*.json"))) == 1 and "config differs" in caplog.text
    copy, = tmp_path.glob("config.*.json")
    copy.rename(tmp_path / "config.20000101T000000Z.json")        # written at an earlier time
    save_run_files(tmp_path, config={"model": {"width": 128}})   # a retry: no second copy
    assert len(list(tmp_path.glob("config.*.json"))) == 1

    class OtherTokenizer(ByteTokenizer):
        fingerprint = "0" * 64

    with pytest.raises(ValueError, match="tokenizer"):
        save_run_files(tmp_path, config=config, tokenizer=OtherTokenizer())


@pytest.mark.parametrize("content,problem", [
    ("{bad", r"is not valid JSON \(Expecting property name"),
    ("", r"is not valid JSON \(Expecting value"),
    (b"\xff{", r"is not valid JSON \(not UTF-8 text"),
    ("[1]", r"is not a JSON object \(holds a list\)"),
])
def test_damaged_run_config_is_an_error_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(RunConfigError, match=re.escape(str(path)) + " " + problem):
        load_run_config(tmp_path)
    assert issubclass(RunConfigError, ValueError)
    with pytest.raises(FileNotFoundError, match="run directory does not exist"):
        load_run_config(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        load_run_config(tmp_path / "elsewhere")
