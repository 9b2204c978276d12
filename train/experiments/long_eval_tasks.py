"""Long-context retrieval samples: passkey and RULER-style needles in a haystack of real text.

A sample of task k at length L and depth d in [0, 1] is one token sequence of exactly L ids:

    haystack[:p_1] needle_1 haystack[p_1:p_2] needle_2 ... haystack[p_n:] question answer

    haystack   n_h = L - |needles| - |question| - |answer| tokens cut from the run's held-out
               text (train/data/pipeline.py eval split, EOS removed; a random offset into a cyclic
               stream, so any L works); a cell with n_h < 0 is too short (None)
    needles    the first needle starts after p = round(d n_h) haystack tokens (an asked
               one), every other needle after a uniform number in [0, n_h] of them
               (multi-value: the needles keep their value order, sorted by position)
    question   ends with the text the answer continues ("... The pass key is")
    answer     " " + the asked value(s), joined by ", " in the order the question asks for
               them (multi-value: the order the needles appear in); tokenised on its own and
               appended, so the prompt/answer boundary is a token boundary

Tasks (values: passkey 5 digits, needles 7 digits; keys: two-word names, distinct per sample):
    passkey            "The pass key is V. Remember it. V is the pass key." (1 needle)
    needle_single      "The special magic number for K is: V."              (1 needle)
    needle_multikey    4 needles with distinct keys, one asked
    needle_multivalue  3 needles "One of the special magic numbers for K is: V." with the
                       same key, all values asked
    needle_multiquery  4 needles with distinct keys, two asked

Scoring (`answer_correct`): teacher forcing. The model reads the whole sequence once; the
sample is correct iff argmax_v logits[j - 1] == tokens[j] at every answer position j. This is
exactly "the greedy continuation of the prompt, |answer| tokens long, equals the answer": each
greedy step would see the same prefix as long as every earlier step was right.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

TASKS = ("passkey", "needle_single", "needle_multikey", "needle_multivalue",
         "needle_multiquery")
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
_ADJECTIVES = ("amber", "brisk", "calm", "dusty", "eager", "fuzzy", "gentle", "hollow", "icy",
               "jolly", "keen", "lofty", "mellow", "nimble", "olive", "plucky", "quiet",
               "rustic", "silent", "tidy", "upbeat", "vivid", "wary", "young")
_NOUNS = ("anchor", "badger", "candle", "dolphin", "ember", "falcon", "garden", "harbor",
          "island", "jacket", "kettle", "lantern", "meadow", "needle", "orchard", "pepper",
          "quarry", "river", "saddle", "tunnel", "umbrella", "valley", "walnut", "zephyr")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One retrieval prompt: tokens [L] int32, the answer occupies tokens[answer_start:]."""

    tokens: np.ndarray
    answer_start: int
    answer: str
    needle_starts: tuple[int, ...]   # token index where each needle begins (text order)


@dataclasses.dataclass(frozen=True)
class _Text:
    needles: list[str]       # needle sentences; needles[0] is the one placed at the depth
    question: str
    answer: str


def _keys(rng: np.random.Generator, count: int) -> list[str]:
    pairs = rng.choice(len(_ADJECTIVES) * len(_NOUNS), size=count, replace=False)
    return [f"{_ADJECTIVES[p // len(_NOUNS)]}-{_NOUNS[p % len(_NOUNS)]}" for p in pairs]


def _numbers(rng: np.random.Generator, count: int, digits: int) -> list[str]:
    low = 10 ** (digits - 1)
    return [str(v) for v in rng.choice(9 * low, size=count, replace=False) + low]


def _passkey(rng):
    (value,) = _numbers(rng, 1, 5)
    return _Text([f"The pass key is {value}. Remember it. {value} is the pass key."],
                 "What is the pass key? The pass key is", f" {value}")


def _magic(key, value):
    return f"The special magic number for {key} is: {value}."


def _single(rng):
    (key,), (value,) = _keys(rng, 1), _numbers(rng, 1, 7)
    return _Text([_magic(key, value)],
                 f"What is the special magic number for {key}? "
                 f"The special magic number for {key} is", f" {value}")


def _multikey(rng, count=4):
    keys, values = _keys(rng, count), _numbers(rng, count, 7)
    return _Text([_magic(k, v) for k, v in zip(keys, values)],
                 f"What is the special magic number for {keys[0]}? "
                 f"The special magic number for {keys[0]} is", f" {values[0]}")


def _multivalue(rng, count=3):
    (key,), values = _keys(rng, 1), _numbers(rng, count, 7)
    return _Text([f"One of the special magic numbers for {key} is: {v}." for v in values],
                 f"What are all the special magic numbers for {key}? "
                 f"The special magic numbers for {key} are", " " + ", ".join(values))


def _multiquery(rng, count=4, asked=2):
    keys, values = _keys(rng, count), _numbers(rng, count, 7)
    names = " and ".join(keys[:asked])
    return _Text([_magic(k, v) for k, v in zip(keys, values)],
                 f"What are the special magic numbers for {names}? "
                 f"The special magic numbers for {names} are",
                 " " + ", ".join(values[:asked]))


_BUILDERS: dict[str, Callable[[np.random.Generator], _Text]] = {
    "passkey": _passkey, "needle_single": _single, "needle_multikey": _multikey,
    "needle_multivalue": _multivalue, "needle_multiquery": _multiquery,
}


def check_tasks(tasks) -> tuple[str, ...]:
    tasks = tuple(tasks)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"tasks: expected some of {TASKS}, got {list(tasks)}")
    return tasks


def make_sample(task: str, encode: Callable[[str], list[int]], haystack: np.ndarray,
                length: int, depth: float, rng: np.random.Generator) -> Sample | None:
    """One sample of `task` with exactly `length` tokens (module docstring), or None when the
    needles, question and answer alone do not fit. `haystack`: int32 token stream (cyclic)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth: expected a value in [0, 1], got {depth}")
    if haystack.size == 0:
        raise ValueError("haystack: the held-out text is empty")
    text = _BUILDERS[task](rng)
    needles = [np.asarray(encode("\n" + n + "\n"), np.int32) for n in text.needles]
    question = np.asarray(encode("\n" + text.question), np.int32)
    answer = np.asarray(encode(text.answer), np.int32)
    filler = length - sum(n.size for n in needles) - question.size - answer.size
    if filler < 0:
        return None
    starts = [round(depth * filler), *rng.integers(0, filler + 1, size=len(needles) - 1).tolist()]
    if task == "needle_multivalue":   # the answer lists the values in text order
        starts.sort()
    offset = int(rng.integers(haystack.size))
    hay = haystack[(offset + np.arange(filler)) % haystack.size]
    pieces, needle_starts, cursor = [], [], 0
    for index in np.argsort(starts, kind="stable"):
        pieces.append(hay[cursor:starts[index]])
        needle_starts.append(sum(piece.size for piece in pieces))
        pieces.append(needles[index])
        cursor = starts[index]
    pieces += [hay[cursor:], question, answer]
    tokens = np.concatenate(pieces).astype(np.int32)
    assert tokens.size == length, (tokens.size, length)
    return Sample(tokens, length - answer.size, text.answer, tuple(needle_starts))


def answer_correct(predicted: np.ndarray, sample: Sample) -> bool:
    """predicted [L]: argmax next-token ids (predicted[j] is the model's guess of tokens[j+1]).
    True iff every answer token is predicted (teacher forcing; module docstring)."""
    start = sample.answer_start
    return bool(np.array_equal(predicted[start - 1:-1], sample.tokens[start:]))
