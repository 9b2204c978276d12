"""data.shuffle="global" (train/data/pipeline.py): grain's per-epoch index shuffle over every
packed row (`train.data.pipeline.PackedRows`), against the window shuffle whose neighbouring
rows come from one stretch of the stream."""

import re

import numpy as np
import pytest

from tests.seeds import case_seed
from train.core.config import ConfigError
from train.core.presets import load_config
from train.data.pipeline import PackedRows, _DocumentTokens, make_dataset
from train.data.sources import resolve_source
from train.data.tokenizer import ByteTokenizer

BYTE = ByteTokenizer()
SEQ_LEN = 15                       # rows of 16 tokens


@pytest.fixture(scope="module")
def long_documents(tmp_path_factory):
    """60 documents of 420-700 bytes, document i written as units "<iii" + 3 random letters:
    every row of 16 tokens names the documents it was cut from, and no two rows are equal."""
    root = tmp_path_factory.mktemp("long_documents")
    rng = np.random.default_rng(case_seed(1100))
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    for index in range(60):
        units = [f"<{index:03d}" + "".join(rng.choice(letters, 3))
                 for _ in range(int(rng.integers(60, 100)))]
        (root / f"d{index:03d}.txt").write_text("".join(units))
    return root


def row_documents(row_tokens) -> set[int]:
    text = bytes(np.asarray(row_tokens, np.uint8).tolist()).decode(errors="replace")
    return {int(m) for m in re.findall(r"<(\d{3})", text)}


def first_rows(corpus, mode, seed, batches=4, **kwargs):
    iterator = iter(make_dataset(source=str(corpus), tokenizer=BYTE, seq_len=SEQ_LEN,
                                 batch_size=2, seed=seed, shuffle_mode=mode, **kwargs))
    rows = [row for _ in range(batches) for row in next(iterator)["tokens"]]
    iterator.close()
    return rows


def test_consecutive_global_batches_do_not_come_from_one_stretch(long_documents):
    """16 rows of 8 consecutive batches: the window shuffle draws them from the 64 rows of
    its first window, i.e. from the two or three documents those rows cover; the global
    shuffle draws them from about 14 of the ~59 training documents (16 uniform draws; fewer
    than 8 distinct has probability far below 1e-4, none in 300 seeds went below 10)."""
    seed = case_seed(1101) % 2**20
    window = [row_documents(r) for r in first_rows(long_documents, "window", seed, batches=8)]
    global_ = [row_documents(r) for r in first_rows(long_documents, "global", seed, batches=8)]
    assert len(set().union(*window)) <= 4                    # one contiguous stretch
    assert len(set().union(*global_)) >= 8, global_


def test_global_shuffle_covers_every_row_once_per_epoch_reshuffled(long_documents):
    seed = case_seed(1102) % 2**20
    corpus = resolve_source(str(long_documents))
    documents = _DocumentTokens(corpus, BYTE)
    order = list(range(len(corpus.keys)))
    packed = PackedRows(documents, order, SEQ_LEN)
    stream = np.concatenate([documents(i)["tokens"] for i in order])
    assert len(packed) == len(stream) // (SEQ_LEN + 1)
    for row in (0, 1, len(packed) // 2, len(packed) - 1):      # rows are the packed stream
        element = packed[row]
        np.testing.assert_array_equal(element["tokens"],
                                      stream[row * (SEQ_LEN + 1):(row + 1) * (SEQ_LEN + 1)])
        starts = np.flatnonzero(np.diff(element["segment_ids"])) + 1
        assert element["segment_ids"][0] == 1 and len(starts) == element["segment_ids"][-1] - 1
        for start in starts:                                   # a new piece follows an EOS
            assert element["tokens"][start - 1] == BYTE.eos_id

    iterator = iter(make_dataset(source=str(long_documents), tokenizer=BYTE, seq_len=SEQ_LEN,
                                 batch_size=1, seed=seed, shuffle_mode="global", split="all",
                                 shuffle=True, num_epochs=2))
    rows = [tuple(batch["tokens"][0]) for batch in iterator]
    epoch_one, epoch_two = rows[:len(packed)], rows[len(packed):]
    assert len(rows) == 2 * len(packed)
    assert sorted(epoch_one) == sorted(epoch_two) and len(set(epoch_one)) == len(packed)
    assert epoch_one != epoch_two                              # a new permutation each epoch


def test_global_shuffle_resumes_exactly(long_documents):
    seed = case_seed(1103) % 2**20
    dataset = make_dataset(source=str(long_documents), tokenizer=BYTE, seq_len=SEQ_LEN,
                           batch_size=3, seed=seed, shuffle_mode="global")
    iterator = iter(dataset)
    for _ in range(int(np.random.default_rng(seed).integers(1, 40))):
        next(iterator)
    state = iterator.get_state()
    expected = [next(iterator) for _ in range(5)]
    resumed = iter(dataset)
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
        np.testing.assert_array_equal(got["segment_ids"], want["segment_ids"])
    iterator.close()
    resumed.close()


def test_shuffle_options_are_validated():
    assert load_config(None, []).data.shuffle == "global"
    with pytest.raises(ConfigError, match="data.shuffle must be 'global' or 'window'"):
        load_config(None, ["data.shuffle=random"])
    with pytest.raises(ConfigError, match="data.shuffle_window must be >= 1"):
        load_config(None, ["data.shuffle_window=0"])
    with pytest.raises(ValueError, match="shuffle_mode"):
        make_dataset(source="stdlib", tokenizer=BYTE, seq_len=8, batch_size=1,
                     shuffle_mode="random")


def test_global_shuffle_over_arrayrecord_shards_matches_the_text_source(long_documents,
                                                                       tmp_path):
    """The shards' manifest keeps each document's token count, so the global shuffle reads no
    record to size the rows; without the counts (older shards) it reads them: same rows."""
    import json

    from train.data.sources import write_arrayrecord_shards

    out = tmp_path / "shards"
    write_arrayrecord_shards(source=str(long_documents), tokenizer=BYTE, out_dir=out,
                             num_shards=2)
    seed = case_seed(1104) % 2**20
    text_rows = first_rows(long_documents, "global", seed, batches=6)
    np.testing.assert_array_equal(first_rows(f"arrayrecord:{out}", "global", seed, batches=6),
                                  text_rows)
    manifest = json.loads((out / "manifest.json").read_text())
    assert resolve_source(f"arrayrecord:{out}").lengths == tuple(
        length for shard in manifest["shards"] for length in shard["lengths"])
    for shard in manifest["shards"]:
        del shard["lengths"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert resolve_source(f"arrayrecord:{out}").lengths is None
    np.testing.assert_array_equal(first_rows(f"arrayrecord:{out}", "global", seed, batches=6),
                                  text_rows)


def test_resuming_in_the_other_shuffle_mode_is_refused(tmp_path):
    """A run's data iterator state is saved in its data.shuffle mode: a resume in the other
    mode is a RunSetupError naming both (runs whose config.json predates the option are
    "window" runs); before the first checkpoint the mode may still change."""
    import json

    from train.checkpoint.run_files import save_run_files
    from train.core.fit import RunSetupError, _check_data_order

    global_, window = load_config(None, []), load_config(None, ["data.shuffle=window"])
    save_run_files(tmp_path, config=global_.to_dict())
    _check_data_order(window, tmp_path)                       # no checkpoint yet
    (tmp_path / "checkpoints" / "2").mkdir(parents=True)
    _check_data_order(global_, tmp_path)
    with pytest.raises(RunSetupError, match="data.shuffle='window' differs from this run's "
                                            "data.shuffle='global'"):
        _check_data_order(window, tmp_path)
    old = json.loads((tmp_path / "config.json").read_text())
    del old["data"]["shuffle"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    _check_data_order(window, tmp_path)
    with pytest.raises(RunSetupError, match="data.shuffle='global' differs"):
        _check_data_order(global_, tmp_path)
