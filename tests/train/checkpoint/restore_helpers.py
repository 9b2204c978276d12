"""What the checkpoint tests restore with and damage: the abstract state of a state (its
shardings kept) and the files holding a saved step's arrays. Shared by
tests/train/checkpoint/test_manager.py and tests/train/checkpoint/test_failed_reads.py."""

import jax


def _abstract(state):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        state)


def _array_data_files(step_dir):
    """The files holding a step's array bytes (OCDBT data files, under state/**/d/)."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    assert files
    return files
