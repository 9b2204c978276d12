"""One-sided Fisher exact test for "method A succeeds more often than method B".

2x2 table: A has a successes in n_a seeds, B has b in n_b. Under H0 (equal success rates),
conditioning on the total successes K = a + b, A's count X is hypergeometric:

    P(X = x) = C(K, x) C(N - K, n_a - x) / C(N, n_a),   N = n_a + n_b
    p = P(X >= a)                                     (alternative: A's rate is greater)
"""

from __future__ import annotations

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
