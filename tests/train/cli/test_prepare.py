"""`python -m train prepare` (train/cli/prepare.py): why a BPE tokenizer is smaller than
--vocab-size."""


def test_prepare_says_why_the_tokenizer_is_smaller_than_asked(tmp_path, capsys):
    from train.cli.entry import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text("abc def ghi\n")                  # no pair occurs twice
    (corpus / "b.py").write_text("xyz uvw\n")
    assert main(["prepare", "--source", str(corpus), "--out", str(tmp_path / "out"),
                 "--vocab-size", "300", "--num-shards", "1"]) == 0
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 1 and notes[0].startswith(
        "note: the tokenizer has 257 entries, fewer than --vocab-size 300"), notes
    assert "at least twice" in notes[0]
