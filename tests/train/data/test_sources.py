"""Document sources (train/data/sources.py): ArrayRecord shards against the text source they
were written from, and the tokenizer check."""

import itertools
import shutil

import numpy as np
import pytest

from tests.train.data.letter_corpus import letter_corpus
from train.data.pipeline import make_dataset
from train.data.sources import write_arrayrecord_shards
from train.data.tokenizer import ByteTokenizer, load_tokenizer, train_bpe


BYTE = ByteTokenizer()


def _assert_same_batches(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
        np.testing.assert_array_equal(a["segment_ids"], b["segment_ids"])


def test_arrayrecord_shards_match_text_source(tmp_path):
    out = tmp_path / "shards"
    paths = write_arrayrecord_shards(source="stdlib", tokenizer=BYTE, out_dir=out, num_shards=3,
                                     max_documents=24)
    assert len(paths) == 3 and all(p.exists() for p in paths)
    assert load_tokenizer(out / "tokenizer").fingerprint == BYTE.fingerprint
    for split in ("train", "eval"):
        kwargs = dict(tokenizer=BYTE, seq_len=40, batch_size=2, seed=8, split=split,
                      heldout_fraction=0.1, num_epochs=1)
        from_text = list(itertools.islice(
            make_dataset(source="stdlib", max_documents=24, **kwargs), 300))
        from_shards = list(itertools.islice(
            make_dataset(source=f"arrayrecord:{out}", **kwargs), 300))
        assert from_text
        _assert_same_batches(from_shards, from_text)
    with pytest.raises(FileExistsError):
        write_arrayrecord_shards(source="stdlib", tokenizer=BYTE, out_dir=out, num_shards=1,
                                 max_documents=2)
    # a shard swapped for another with as many records: the manifest's lengths no longer
    # hold, so it is refused when the source is opened (not an IndexError mid-run)
    missing = tmp_path / "missing_one"                  # a shard the manifest lists is gone
    shutil.copytree(out, missing)
    (missing / paths[2].name).unlink()
    with pytest.raises(FileNotFoundError, match=f"{paths[2].name} listed in"):
        make_dataset(source=f"arrayrecord:{missing}", tokenizer=BYTE, seq_len=8, batch_size=1)
    assert list(make_dataset(source=f"arrayrecord:{missing}/tokens-0000[01]-*", tokenizer=BYTE,
                             seq_len=8, batch_size=1, num_epochs=1))    # a glob may choose
    assert paths[0].stat().st_size != paths[1].stat().st_size
    shutil.copyfile(paths[1], paths[0])                 # 8 records each, other documents
    with pytest.raises(ValueError, match="changed after it was written"):
        make_dataset(source=f"arrayrecord:{out}", tokenizer=BYTE, seq_len=8, batch_size=1)


def test_arrayrecord_rejects_other_tokenizer(tmp_path):
    corpus_dir = tmp_path / "text"
    corpus_dir.mkdir()
    letter_corpus(corpus_dir, 10, seed=1)
    bpe = train_bpe(sorted(corpus_dir.iterdir()), 270)
    write_arrayrecord_shards(source=str(corpus_dir), tokenizer=bpe, out_dir=tmp_path / "s",
                             num_shards=2)
    with pytest.raises(ValueError, match="tokenizer"):
        make_dataset(source=f"arrayrecord:{tmp_path / 's'}", tokenizer=BYTE, seq_len=8,
                     batch_size=1)
