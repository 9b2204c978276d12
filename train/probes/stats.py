"""One-sided tests for "method A succeeds more often than method B" over seeds.

Fisher's exact test (seeds unpaired):

2x2 table: A has a successes in n_a seeds, B has b in n_b. Under H0 (equal success rates),
conditioning on the total successes K = a + b, A's count X is hypergeometric:

    P(X = x) = C(K, x) C(N - K, n_a - x) / C(N, n_a),   N = n_a + n_b
    p = P(X >= a)                                     (alternative: A's rate is greater)

The exact sign test paired by seed (McNemar's exact test; the paper's p-values, e.g. 2^-11):
of the n seeds where exactly one method succeeds, A succeeds in k; under H0 each such seed
favours A with probability 1/2, so

    p = P(Bin(n, 1/2) >= k) = sum_{x >= k} C(n, x) / 2^n    (1 when n = 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def fisher_greater(a: int, n_a: int, b: int, n_b: int) -> float:
    """Exact one-sided p-value P(X >= a) of Fisher's test; see the module docstring."""
    for name, value, total in (("a", a, n_a), ("b", b, n_b)):
        if not (0 <= value <= total):
            raise ValueError(f"fisher_greater: {name} must be in [0, {total}], got {value}")
    total, successes = n_a + n_b, a + b
    denominator = comb(total, n_a)
    upper = min(successes, n_a)
    numerator = sum(comb(successes, x) * comb(total - successes, n_a - x) for x in range(a, upper + 1))
    return numerator / denominator


def sign_test_greater(a_success: Sequence[bool], b_success: Sequence[bool]) -> float:
    """Exact one-sided p-value of the sign test paired by seed; see the module docstring."""
    if len(a_success) != len(b_success):
        raise ValueError(f"sign_test_greater: a_success and b_success must pair seeds one to "
                         f"one, got {len(a_success)} and {len(b_success)} seeds")
    a_only = sum(bool(a) and not bool(b) for a, b in zip(a_success, b_success))
    b_only = sum(bool(b) and not bool(a) for a, b in zip(a_success, b_success))
    discordant = a_only + b_only
    return sum(comb(discordant, x) for x in range(a_only, discordant + 1)) / 2 ** discordant
