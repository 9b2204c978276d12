"""Tokenizers (train/data/tokenizer.py): bytes and BPE, saved and loaded."""

import json
import pickle

import numpy as np
import pytest

from train.data.pipeline import make_dataset
from train.data.tokenizer import BPE_EOS_TOKEN, ByteTokenizer, load_tokenizer, train_bpe


BYTE = ByteTokenizer()


def test_bpe_train_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(31)
    words = ["def", "return", "self", "import", "lambda", "ünïcode", "日本語", "x_1", "  "]
    files = []
    for i in range(4):
        path = tmp_path / f"corpus_{i}.txt"
        path.write_text(" ".join(rng.choice(words, size=400)) + "\n")
        files.append(path)
    tokenizer = train_bpe(files, 300, tmp_path / "tok")
    assert 257 <= tokenizer.vocab_size <= 300
    loaded = load_tokenizer(tmp_path / "tok")
    assert loaded.fingerprint == tokenizer.fingerprint and loaded.eos_id == tokenizer.eos_id
    text = "def f(self):\n\treturn 日本語 + 'ünïcode'  " + BPE_EOS_TOKEN + " tail\r\n"
    for candidate in (tokenizer, loaded, pickle.loads(pickle.dumps(loaded))):
        ids = candidate.encode(text)
        assert tokenizer.eos_id not in ids  # text spelling the EOS token stays text
        assert candidate.decode(ids) == text
        np.testing.assert_array_equal(candidate.encode_array(text), ids)
    assert len(tokenizer.encode(" ".join(words))) < len(" ".join(words).encode())

    dataset = make_dataset(source=str(tmp_path / "corpus_*.txt"), tokenizer=loaded, seq_len=32,
                           batch_size=2, seed=3, split="all")
    batch = next(iter(dataset))
    assert batch["tokens"].max() < loaded.vocab_size
    np.testing.assert_array_equal(np.diff(batch["segment_ids"], axis=1) == 1,
                                  batch["tokens"][:, :-1] == loaded.eos_id)


def test_byte_tokenizer(tmp_path):
    text = "héllo\x00 wörld 日本\n"
    ids = BYTE.encode(text)
    assert BYTE.vocab_size == 257 and BYTE.eos_id == 256 and max(ids) < 256
    assert BYTE.decode(ids + [BYTE.eos_id]) == text
    BYTE.save(tmp_path / "tok")
    assert isinstance(load_tokenizer(tmp_path / "tok"), ByteTokenizer)
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)
    with pytest.raises(ValueError, match="ids"):
        BYTE.decode([257])
    with pytest.raises(ValueError, match="tokenizer"):
        load_tokenizer(tmp_path / "missing")


def test_byte_ids_are_the_utf8_bytes():
    assert BYTE.encode("aé€") == [0x61, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]
    array = BYTE.encode_array("aé€")
    assert array.dtype == np.int32 and array.tolist() == [0x61, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]
    assert BYTE.decode([0xC3]) == "\ufffd"                      # a cut character: U+FFFD
    assert BYTE.decode([0x68, BYTE.eos_id, 0x69]) == "hi"       # EOS dropped


def test_ids_are_checked():
    with pytest.raises(ValueError,
                       match=r"ids: expected a 1-D sequence of ints, got shape \(1, 2\)"):
        BYTE.decode([[1, 2]])
    with pytest.raises(TypeError, match="ids: expected integers, got dtype float64"):
        BYTE.decode([1.0])
    with pytest.raises(ValueError,
                       match=r"ids: expected values in \[0, 257\), got range \[-1, 3\]"):
        BYTE.decode([3, -1])


def test_train_bpe_refuses_bad_arguments(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("aaaa bbbb aaaa bbbb\n")
    with pytest.raises(ValueError, match="vocab_size: expected an int >= 257, got 256"):
        train_bpe([text], 256)
    with pytest.raises(ValueError, match="files: expected at least one file, got none"):
        train_bpe([], 300)
    with pytest.raises(ValueError, match="files: not regular files"):
        train_bpe([text, tmp_path / "missing.txt"], 300)


def test_load_tokenizer_names_what_is_wrong_with_the_directory(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="expected 'byte' or a directory containing "
                                         "tokenizer_meta.json"):
        load_tokenizer(tmp_path)
    BYTE.save(tmp_path / "byte")
    meta_path = tmp_path / "byte" / "tokenizer_meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta == {"kind": "byte", "vocab_size": 257, "eos_id": 256,
                    "fingerprint": BYTE.fingerprint}
    meta_path.write_text(json.dumps({**meta, "fingerprint": "0" * 64}))
    with pytest.raises(ValueError, match="the directory is inconsistent"):
        load_tokenizer(tmp_path / "byte")
    meta_path.write_text(json.dumps({**meta, "kind": "words"}))
    with pytest.raises(ValueError, match="unknown tokenizer kind 'words'"):
        load_tokenizer(tmp_path / "byte")
