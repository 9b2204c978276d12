"""A corpus whose documents tell themselves apart by one byte: LETTERS[i] repeated."""

import string

import numpy as np


LETTERS = string.ascii_letters + string.digits  # 62 one-byte symbols, one per document


def letter_corpus(directory, count, seed):
    """count documents; document i is LETTERS[i] repeated 3..40 times plus a newline."""
    rng = np.random.default_rng(seed)
    texts = {}
    for i in range(count):
        text = LETTERS[i] * int(rng.integers(3, 41)) + "\n"
        (directory / f"doc_{i:02d}.txt").write_text(text)
        texts[f"doc_{i:02d}.txt"] = text
    return texts
