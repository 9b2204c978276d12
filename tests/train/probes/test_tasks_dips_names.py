"""Variable-duration dips and live names: generators vs brute-force replays, FPA's construction
checked with the dense bias, and checks that the answers need what the probes claim to test
(the exact depth of a dip, not its sum over time; the order of the tokens; the key's own level).
"""

import numpy as np
import pytest

from train.probes import tasks
from train.probes.tasks import PAD, TASKS, live_names_layout, variable_dips_layout
from tests.seeds import case_seed

SEEDS = (0, 7, case_seed(31))


def rows(data):
    for tokens, targets, mask in zip(data.tokens, data.targets, data.mask):
        tokens = [int(t) for t in tokens]
        while tokens and tokens[-1] == PAD:
            tokens.pop()
        yield tokens, [int(t) for t in targets], [bool(m) for m in mask]


# ------------------------------------------------------------------------------ variable dips


def excursion_levels(steps, lay, levels):
    """The levels a dip's DOWN / UP tokens pass through, from the surface; checks that it
    stays between level 0 and the surface and ends at the surface."""
    level, seen = levels, []
    for t in steps:
        assert t in (lay["down"], lay["up"]), t
        level += -1 if t == lay["down"] else 1
        assert 0 <= level <= levels
        seen.append(level)
    assert level == levels
    return seen


def replay_dips(tokens, levels, num_values):
    """Replays one sequence: the level starts at `levels`, DOWN -1, UP +1. Returns the steps
    of the dip before the first key (empty without one) and, per scored position, (query
    token, name, threshold j, lowest level since the key, the depth D of the dip among the
    keys, its steps). Checks the format: an optional dip, then keys with one dip among them
    after the first key, each dip from the surface back to it, then one query per key."""
    lay = variable_dips_layout(levels, num_values)
    first_key = next(i for i, t in enumerate(tokens) if lay["key"] <= t < lay["ask"])
    early = tokens[:first_key]
    if early:
        excursion_levels(early, lay, levels)
    at = [i for i, t in enumerate(tokens) if t in (lay["down"], lay["up"]) and i > first_key]
    assert at == list(range(at[0], at[0] + len(at)))            # one contiguous dip
    steps = [tokens[i] for i in at]
    seen = excursion_levels(steps, lay, levels)
    level, lowest_since, answers = levels, {}, {}
    for i, t in enumerate(tokens[first_key:], start=first_key):
        if t in (lay["down"], lay["up"]):
            assert not answers
            level = seen[i - at[0]]
            lowest_since = {v: min(m, level) for v, m in lowest_since.items()}
        elif lay["key"] <= t < lay["ask"]:
            assert not answers and t - lay["key"] not in lowest_since
            lowest_since[t - lay["key"]] = levels
        else:
            name, threshold = divmod(t - lay["ask"], levels)
            answers[i] = (t, name, threshold + 1, lowest_since.pop(name))
    assert not lowest_since                                      # every key asked once
    return early, {i: (*a, levels - min(seen), steps) for i, a in answers.items()}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("levels, wiggles, fixed, early_dip",
                         [(1, 0, 0, 0), (5, 3, 0, 1), (4, 2, 1, 1)])
def test_variable_dips_matches_replay(seed, levels, wiggles, fixed, early_dip):
    num_values = 5
    data = tasks.variable_dips(seed, 40, levels=levels, num_keys=3, num_values=num_values,
                               max_wiggles=wiggles, fixed_duration=fixed, early_dip=early_dip)
    lay = variable_dips_layout(levels, num_values)
    assert data.vocab_size == lay["vocab_size"]
    lengths = set()
    for tokens, targets, mask in rows(data):
        early, answers = replay_dips(tokens, levels, num_values)
        assert bool(early) == bool(early_dip)
        assert sorted(answers) == [i for i, m in enumerate(mask) if m]
        for i, (_, _, j, lowest, depth, steps) in answers.items():
            assert j in ({levels - depth + 1} if depth == levels else
                         {levels - depth, levels - depth + 1})   # thresholds at the bottom
            assert targets[i] == (lay["fell"] if lowest < j else lay["held"])
            assert len(steps) % 2 == 0 and 2 * depth <= len(steps) <= 2 * depth + 2 * wiggles
            for dip in (steps, early) if early else (steps,):
                depth = levels - min(excursion_levels(dip, lay, levels))
                if fixed:   # the control: DOWN^D (UP DOWN)^w UP^D
                    assert dip == ([lay["down"]] * depth + [lay["up"], lay["down"]] * wiggles
                                   + [lay["up"]] * depth)
                lengths.add(len(dip) - 2 * depth)
        assert all(targets[i] == PAD for i, m in enumerate(mask) if not m)
    assert lengths == ({2 * wiggles} if fixed else set(range(0, 2 * wiggles + 1, 2)))
    assert {lay["fell"], lay["held"]} == set(data.targets[data.mask])


def walk_fields(data, lay, up_step=1.0, down_offset=0.0, up_offset=0.0, other_offset=0.0):
    """docs/experiments.md's construction: walk -1 at DOWN, +up_step at UP, 0 elsewhere (the
    surface is 0); field phi = W + g with g = the given offsets at DOWN / UP / other tokens;
    level psi = W (every key is written at the surface)."""
    from fpa_jax import fields

    tokens = data.tokens
    down, up = tokens == lay["down"], tokens == lay["up"]
    delta = np.where(down, -1.0, np.where(up, up_step, 0.0))
    g = np.where(down, down_offset, np.where(up, up_offset, other_offset))
    f32 = lambda a: a[..., None].astype(np.float32)
    return fields(f32(delta), f32(g), f32(np.zeros_like(delta)))


def key_positions(tokens, lay):
    return {t - lay["key"]: s for s, t in enumerate(tokens) if lay["key"] <= t < lay["ask"]}


def test_variable_dips_fpa_bias_is_the_depth_whatever_the_duration():
    """With the walk construction FPA's bias at (query, asked key) is -(r - lowest level since
    the key): the depth and nothing else, so FELL <=> bias < j - r - 1/2 for every duration."""
    from fpa_jax import fpa_bias

    levels, num_values = 5, 4
    lay = variable_dips_layout(levels, num_values)
    data = tasks.variable_dips(case_seed(32), 30, levels=levels, num_values=num_values,
                               max_wiggles=4)
    phi, psi = walk_fields(data, lay)
    bias = np.asarray(fpa_bias(phi, psi, np.ones(1, np.float32)))[:, 0]
    for row, (tokens, targets, mask) in enumerate(rows(data)):
        keys = key_positions(tokens, lay)
        for t, (_, name, j, lowest, _, _) in replay_dips(tokens, levels, num_values)[1].items():
            b = bias[row, t, keys[name]]
            assert b == lowest - levels
            assert (targets[t] == lay["fell"]) == (b < j - levels - 0.5)


def dip_sum_queries(data, levels, num_values):
    """Per scored position: query token, target (FELL?), and the dip's steps after the asked
    key ([Q, L]: +1 DOWN, -1 UP, 0 padding; all 0 for a key written after the dip)."""
    lay = variable_dips_layout(levels, num_values)
    queries, fell, steps = [], [], []
    for tokens, targets, _ in rows(data):
        after = {}
        for i, t in enumerate(tokens):
            if t in (lay["down"], lay["up"]):
                for s in after.values():
                    s.append(1 if t == lay["down"] else -1)
            elif lay["key"] <= t < lay["ask"]:
                after[t - lay["key"]] = []
            else:
                queries.append(t), fell.append(targets[i] == lay["fell"])
                steps.append(after[(t - lay["ask"]) // levels])
    padded = np.zeros((len(steps), max(map(len, steps))))
    for row, s in enumerate(steps):
        padded[row, :len(s)] = s
    return np.array(queries), np.array(fell), padded


def dip_sums(steps, up_step, down_offset, up_offset):
    """sum_u max(0, -W_u - g_u) over the dip's steps after the key, W the walk (-1 per DOWN,
    +up_step per UP, 0 at the key): dip-sum FPA's -bias / beta with walk_fields(up_step,
    down_offset, up_offset) and a field offset at the other tokens high enough to add nothing."""
    walk = np.cumsum(np.where(steps > 0, -1.0, np.where(steps < 0, up_step, 0.0)), axis=1)
    offset = np.where(steps > 0, down_offset, up_offset)
    return np.sum(np.where(steps != 0, np.maximum(0.0, -walk - offset), 0.0), axis=1)


def deepest(steps):
    """How many levels below the surface the dip went after the key (0 without one)."""
    return np.max(np.cumsum(steps, axis=1), axis=1, initial=0)


def best_threshold_accuracy(queries, fell, score):
    """The best accuracy of 'FELL iff score > theta_q' (or '<', whichever is better), with a
    threshold theta_q chosen per query token on this very sample."""
    correct = 0
    for q in np.unique(queries):
        s, y = score[queries == q], fell[queries == q]
        order = np.argsort(s, kind="stable")
        s, y = s[order], y[order]
        cuts = np.concatenate([[0], np.flatnonzero(np.diff(s) > 0) + 1, [len(s)]])
        below_true = np.concatenate([[0], np.cumsum(y)])[cuts]       # FELL among the first i
        below_false = cuts - below_true
        above = lambda c: (c[-1] - c)
        greater = below_false + above(below_true)   # predict FELL above the cut
        lesser = below_true + above(below_false)    # predict FELL below the cut
        correct += max(greater.max(), lesser.max())
    return correct / len(queries)


def test_dip_sums_match_the_dense_dip_sum_bias():
    """dip_sums (the fast path of the ceiling test below) against the library's dense dip-sum
    bias for the same walk and field."""
    from fpa_jax.baselines.dipsum import dip_sum_bias

    levels, num_values = 4, 4
    lay = variable_dips_layout(levels, num_values)
    data = tasks.variable_dips(case_seed(33), 12, levels=levels, num_values=num_values,
                               max_wiggles=3)
    queries, _, steps = dip_sum_queries(data, levels, num_values)
    assert len(queries) == 12 * 4
    for up_step, down_offset, up_offset in ((1.0, 0.0, 0.0), (1.0, 1.5, -0.5), (3.0, 2.0, 3.0),
                                            (0.5, 1.0, -1.0)):
        phi, psi = walk_fields(data, lay, up_step, down_offset, up_offset, other_offset=100.0)
        bias = np.asarray(dip_sum_bias(phi, psi, np.ones(1, np.float32)))[:, 0]
        expected = [-bias[row, t, key_positions(tokens, lay)[(tokens[t] - lay["ask"]) // levels]]
                    for row, (tokens, _, mask) in enumerate(rows(data))
                    for t in np.flatnonzero(mask)]
        np.testing.assert_allclose(dip_sums(steps, up_step, down_offset, up_offset), expected,
                                   rtol=1e-5, atol=1e-4)


def test_variable_dips_answers_need_the_exact_depth():
    """A dip-sum head decides from the sum of its dips after the key. Over a grid of walks
    (UP steps of 0.5..5 levels against DOWN's 1) and field offsets at DOWN and UP, no threshold
    per query token on that sum reaches the success threshold when the dips wiggle at random
    places; in the fixed-duration control one does, exactly. The depth (FPA's bias) answers
    every query exactly in both."""
    levels, num_values = 6, 4
    threshold = TASKS["variable_dips"].threshold
    offsets = np.arange(-1.0, levels + 1.01, 1.0)
    walks = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0)

    def best(data):
        queries, fell, steps = dip_sum_queries(data, levels, num_values)
        assert best_threshold_accuracy(queries, fell, deepest(steps).astype(float)) == 1.0
        return max(best_threshold_accuracy(queries, fell, dip_sums(steps, b, c, d))
                   for b in walks for c in offsets for d in offsets)

    variable = tasks.variable_dips(case_seed(34), 1200, levels=levels, num_values=num_values)
    assert best(variable) < threshold - 0.005       # 0.92-0.94 on such samples
    fixed = tasks.variable_dips(case_seed(35), 400, levels=levels, num_values=num_values,
                                fixed_duration=1)
    assert best(fixed) == 1.0


def test_variable_dips_needs_order():
    """Whether the dip came after the key is order: a function of the query and the bag of
    earlier tokens stays below the threshold (measured exactly at a size where bags repeat)."""
    small = tasks.variable_dips(case_seed(36), 20000, levels=2, num_keys=2, max_wiggles=1)
    assert tasks.order_blind_ceiling(small) < TASKS["variable_dips"].threshold - 0.05


# ------------------------------------------------------------------------------ live names


def replay_names(tokens, levels, num_values, copies=1):
    """Explicit alive list: DIP(d) removes every earlier key above level d; a name is answered
    ALIVE when all its keys (`copies` of them) are alive."""
    lay = live_names_layout(levels, num_values)
    alive, written, answers = [], [], {}
    for i, t in enumerate(tokens):
        if lay["key"] <= t < lay["dip"]:
            level, name = divmod(t - lay["key"], num_values)
            written.append(name)
            alive.append((name, level + 1))
        elif lay["dip"] <= t < lay["ask"]:
            assert not answers
            alive = [(n, level) for n, level in alive if level <= t - lay["dip"]]
        else:
            name = t - lay["ask"]
            assert written.count(name) == copies
            live = sum(n == name for n, _ in alive)
            answers[i] = lay["alive"] if live == copies else lay["dead"]
    assert len(answers) * copies == len(written)
    return answers


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("levels, num_keys, num_dips, copies",
                         [(1, 1, 1, 1), (4, 5, 2, 1), (6, 3, 4, 1), (5, 6, 2, 2), (4, 6, 1, 3)])
def test_live_names_matches_replay(seed, levels, num_keys, num_dips, copies):
    data = tasks.live_names(seed, 40, levels=levels, num_keys=num_keys,
                            num_values=num_keys + 1, num_dips=num_dips, copies=copies)
    assert data.vocab_size == live_names_layout(levels, num_keys + 1)["vocab_size"]
    for tokens, targets, mask in rows(data):
        answers = replay_names(tokens, levels, num_keys + 1, copies)
        assert sorted(answers) == [i for i, m in enumerate(mask) if m]
        assert all(targets[i] == answers.get(i, PAD) for i in range(len(tokens)))
    if levels > 1:
        assert {1, 2} == set(data.targets[data.mask])


@pytest.mark.parametrize("copies", [1, 2])
def test_live_names_fpa_live_keys_are_the_alive_names(copies):
    """FPA's construction with the dense bias: flat walk, field d + 1/2 at DIP(d) and r + 1
    elsewhere, level l at KEY(v, l) (-1 elsewhere). A name is answered ALIVE exactly when all
    its keys (`copies` of them) have bias 0 at the query."""
    from fpa_jax import fields, fpa_bias

    levels, num_values = 5, 6
    lay = live_names_layout(levels, num_values)
    data = tasks.live_names(case_seed(37), 30, levels=levels, num_keys=4 * copies,
                            num_values=num_values, num_dips=3, copies=copies)
    tokens = data.tokens
    is_key = (tokens >= lay["key"]) & (tokens < lay["dip"])
    is_dip = (tokens >= lay["dip"]) & (tokens < lay["ask"])
    g = np.where(is_dip, tokens - lay["dip"] + 0.5, levels + 1.0)
    h = np.where(is_key, (tokens - lay["key"]) // num_values + 1.0, -1.0)
    f32 = lambda a: a[..., None].astype(np.float32)
    phi, psi = fields(f32(np.zeros(tokens.shape)), f32(g), f32(h))
    bias = np.asarray(fpa_bias(phi, psi, np.ones(1, np.float32)))[:, 0]
    answers = set()
    for row, (toks, targets, mask) in enumerate(rows(data)):
        for t in np.flatnonzero(mask):
            live = [(toks[s] - lay["key"]) % num_values for s in np.flatnonzero(is_key[row, :t])
                    if bias[row, t, s] == 0.0]
            answers.add(targets[t])
            assert (targets[t] == lay["alive"]) == (live.count(toks[t] - lay["ask"]) == copies)
    assert answers == {lay["alive"], lay["dead"]}


def test_live_names_needs_order_and_the_keys_own_level():
    """The bag of tokens is not enough (order-blind ceiling below the threshold), and neither
    is everything written after the key: grouping the queries by the asked key's suffix (the
    write-phase tokens after it, all a bias without the key's level sees) leaves answers that
    only the key's level decides. Exact at sizes where bags and suffixes repeat."""
    threshold = TASKS["live_names"].threshold
    small = tasks.live_names(case_seed(38), 20000, levels=3, num_keys=3, num_values=3,
                             num_dips=1)
    assert tasks.order_blind_ceiling(small) < threshold - 0.05
    lay = live_names_layout(3, 3)
    groups = {}
    for tokens, targets, mask in rows(small):
        write = [t for t, m in zip(tokens, mask) if not m]
        for t in np.flatnonzero(mask):
            name = tokens[t] - lay["ask"]
            s = next(s for s, u in enumerate(write)
                     if lay["key"] <= u < lay["dip"] and (u - lay["key"]) % 3 == name)
            counts = groups.setdefault(tuple(write[s + 1:]), {})
            counts[targets[t]] = counts.get(targets[t], 0) + 1
    ceiling = (sum(max(c.values()) for c in groups.values())
               / sum(sum(c.values()) for c in groups.values()))
    assert ceiling < threshold - 0.05


def test_dips_and_names_reject_bad_sizes():
    with pytest.raises(ValueError, match="fixed_duration"):
        tasks.variable_dips(0, 4, fixed_duration=2)
    with pytest.raises(ValueError, match="num_values"):
        tasks.variable_dips(0, 4, num_keys=5, num_values=4)
    with pytest.raises(ValueError, match="num_values"):
        tasks.live_names(0, 4, num_keys=5, num_values=4)
    with pytest.raises(ValueError, match="levels"):
        tasks.live_names(0, 4, levels=0)
    with pytest.raises(ValueError, match="multiple of copies"):
        tasks.live_names(0, 4, num_keys=5, copies=2)
