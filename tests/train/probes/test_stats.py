"""The one-sided tests of "method A succeeds more often than method B" over seeds
(train/probes/stats.py): Fisher's exact test (seeds unpaired) and the exact sign test paired by
seed, against brute-force enumeration of every outcome under H0, scipy.stats where installed, and
the paper's p-values."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats      # a dependency of jax, so always installed

from tests.seeds import case_seed
from train.probes.stats import fisher_greater, sign_test_greater


def fisher_by_enumeration(a, n_a, b, n_b):
    """P(X >= a): under H0 (conditioned on the a + b successes) every placement of the
    successes among the n_a + n_b seeds is equally likely; X counts those in A's seeds."""
    seeds, successes = n_a + n_b, a + b
    placements = list(itertools.combinations(range(seeds), successes))
    extreme = sum(sum(seed < n_a for seed in placement) >= a for placement in placements)
    return Fraction(extreme, len(placements))


def sign_test_by_enumeration(a_success, b_success):
    """P(at least as many discordant seeds favour A) over all 2^n ways the n discordant seeds
    could have gone, each with probability 2^-n under H0."""
    favours_a = [bool(a) for a, b in zip(a_success, b_success) if bool(a) != bool(b)]
    k, n = sum(favours_a), len(favours_a)
    outcomes = list(itertools.product((False, True), repeat=n))
    return Fraction(sum(sum(outcome) >= k for outcome in outcomes), len(outcomes))


def scipy_fisher(a, n_a, b, n_b):
    return stats.fisher_exact([[a, n_a - a], [b, n_b - b]], alternative="greater")[1]


def scipy_sign_test(a_success, b_success):
    a, b = np.asarray(a_success, bool), np.asarray(b_success, bool)
    k, n = int(np.sum(a & ~b)), int(np.sum(a != b))
    return stats.binomtest(k, n, 0.5, alternative="greater").pvalue if n else 1.0


# ------------------------------------------------------------------------------ Fisher


def test_fisher_matches_known_values_and_scipy():
    # Fisher's tea-tasting table [[3, 1], [1, 3]]: one-sided p = 17/70.
    assert fisher_greater(3, 4, 1, 4) == pytest.approx(17 / 70, rel=1e-12)
    # 13/15 vs 0/15: only the observed table is as extreme: C(15,13) C(15,0) / C(30,13).
    assert fisher_greater(13, 15, 0, 15) == pytest.approx(105 / 119759850, rel=1e-12)
    assert fisher_greater(0, 15, 15, 15) == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    for _ in range(20):
        n_a, n_b = rng.integers(1, 20, size=2)
        a, b = rng.integers(0, n_a + 1), rng.integers(0, n_b + 1)
        expected = scipy_fisher(a, n_a, b, n_b)
        assert fisher_greater(int(a), int(n_a), int(b), int(n_b)) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="a must be"):
        fisher_greater(5, 4, 0, 4)


def test_sign_test_paired_by_seed_matches_known_values_and_scipy():
    # all 11 discordant seeds favour A: p = 2^-11 (the paper's form); ties carry no weight
    a = [True] * 11 + [True, False] * 2
    b = [False] * 11 + [True, False] * 2
    assert sign_test_greater(a, b) == pytest.approx(2.0 ** -11, rel=1e-12)
    # 3 of 4 discordant seeds favour A: (C(4, 3) + C(4, 4)) / 16
    assert sign_test_greater([1, 1, 1, 0, 1], [0, 0, 0, 1, 1]) == pytest.approx(5 / 16)
    assert sign_test_greater([True, False], [True, False]) == 1.0       # no discordant seed
    assert sign_test_greater([False] * 3, [True] * 3) == 1.0
    rng = np.random.default_rng(4)
    for _ in range(20):
        a, b = rng.random(15) < rng.random(), rng.random(15) < rng.random()
        expected = scipy_sign_test(a, b)
        assert sign_test_greater(list(a), list(b)) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="pair seeds"):
        sign_test_greater([True], [True, False])


def test_fisher_equals_enumeration_of_every_small_table():
    """Every table with at most 5 seeds a side, exactly: both sides divide the same integers."""
    for n_a, n_b in itertools.product(range(6), repeat=2):
        for a, b in itertools.product(range(n_a + 1), range(n_b + 1)):
            expected = fisher_by_enumeration(a, n_a, b, n_b)
            assert fisher_greater(a, n_a, b, n_b) == float(expected), (a, n_a, b, n_b)


def test_fisher_on_random_larger_tables_matches_enumeration_and_scipy():
    rng = np.random.default_rng(case_seed(5200))
    for _ in range(12):
        n_a, n_b = (int(n) for n in rng.integers(1, 9, size=2))
        a, b = int(rng.integers(0, n_a + 1)), int(rng.integers(0, n_b + 1))
        p = fisher_greater(a, n_a, b, n_b)
        assert p == pytest.approx(float(fisher_by_enumeration(a, n_a, b, n_b)), rel=1e-12)
        assert p == pytest.approx(scipy_fisher(a, n_a, b, n_b), rel=1e-9)


def test_fisher_edges():
    # nothing to compare (no seeds, or no successes, or every seed succeeds): p = 1
    assert fisher_greater(0, 0, 0, 0) == 1.0
    assert fisher_greater(0, 0, 3, 5) == 1.0
    assert fisher_greater(0, 7, 0, 7) == 1.0
    assert fisher_greater(7, 7, 7, 7) == 1.0
    # A wins all of its seeds, B none: the observed table alone, 1 / C(n_a + n_b, n_a)
    assert fisher_greater(15, 15, 0, 15) == pytest.approx(1 / 155117520, rel=1e-12)
    assert fisher_greater(1, 1, 0, 1) == 0.5
    # a direction: B ahead gives a large p, A ahead a small one
    assert fisher_greater(0, 15, 12, 15) == 1.0
    assert fisher_greater(12, 15, 0, 15) < 1e-5


@pytest.mark.parametrize("args, name", [((-1, 4, 0, 4), "a"), ((5, 4, 0, 4), "a"),
                                        ((0, 4, -1, 4), "b"), ((0, 4, 5, 4), "b"),
                                        ((1, 0, 0, 4), "a")])
def test_fisher_rejects_counts_outside_their_seeds(args, name):
    total = args[1] if name == "a" else args[3]
    value = args[0] if name == "a" else args[2]
    with pytest.raises(ValueError, match=rf"^fisher_greater: {name} must be in \[0, {total}\], "
                                         rf"got {value}$"):
        fisher_greater(*args)


# ------------------------------------------------------------------------------ sign test


@pytest.mark.parametrize("discordant, concordant", [(11, 4), (12, 3), (13, 2)])
def test_sign_test_gives_the_papers_p_values(discordant, concordant):
    """15 seeds, `discordant` of them won by A alone (the rest won by both or by neither):
    p = 2^-discordant exactly (the paper's 2^-11, 2^-12 and 2^-13); all won by B alone: p = 1."""
    both, neither = concordant // 2, concordant - concordant // 2
    a = [True] * discordant + [True] * both + [False] * neither
    b = [False] * discordant + [True] * both + [False] * neither
    assert len(a) == 15
    assert sign_test_greater(a, b) == 2.0 ** -discordant
    assert sign_test_greater(b, a) == 1.0
    order = np.random.default_rng(case_seed(5201 + discordant)).permutation(15)
    shuffled = [a[i] for i in order], [b[i] for i in order]    # the seeds' order is immaterial
    assert sign_test_greater(*shuffled) == 2.0 ** -discordant
    # one discordant seed going the other way: (1 + n) / 2^(n + 1)
    assert sign_test_greater(a + [False], b + [True]) == (1 + discordant + 1) / 2.0 ** (
        discordant + 1)


def test_sign_test_equals_enumeration_of_every_short_pairing():
    """Every pair of outcome sequences over at most 5 seeds, exactly."""
    for seeds in range(6):
        for outcomes in itertools.product((False, True), repeat=2 * seeds):
            a, b = outcomes[:seeds], outcomes[seeds:]
            assert sign_test_greater(a, b) == float(sign_test_by_enumeration(a, b)), (a, b)


def test_sign_test_on_random_pairings_matches_enumeration_and_scipy():
    rng = np.random.default_rng(case_seed(5202))
    for _ in range(12):
        seeds = int(rng.integers(1, 14))
        a, b = rng.random(seeds) < rng.random(), rng.random(seeds) < rng.random()
        p = sign_test_greater(a, b)      # numpy booleans, as the runner's arrays give
        assert p == pytest.approx(float(sign_test_by_enumeration(a, b)), rel=1e-12)
        assert p == pytest.approx(scipy_sign_test(a, b), rel=1e-9)


def test_sign_test_edges():
    assert sign_test_greater([], []) == 1.0
    assert sign_test_greater([True], [False]) == 0.5
    assert sign_test_greater([False], [True]) == 1.0
    assert sign_test_greater([1, 0, 2], [0, 0, 0]) == 0.25      # truthiness, not identity
    # a 50/50 split of discordant seeds: P(Bin(4, 1/2) >= 2) = 11/16
    assert sign_test_greater([True, True, False, False], [False, False, True, True]) == 11 / 16


def test_sign_test_rejects_unpaired_seeds():
    with pytest.raises(ValueError, match=r"^sign_test_greater: a_success and b_success must "
                                         r"pair seeds one to one, got 2 and 3 seeds$"):
        sign_test_greater([True, False], [True, False, True])
