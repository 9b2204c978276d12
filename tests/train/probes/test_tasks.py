"""Probe generators vs brute-force solvers, and the vmapped runner."""

import csv
import itertools
import json
from collections import Counter

import numpy as np
import pytest

from train.probes import tasks
from train.probes.runner import ProbeConfig, run_probe, seed_data, train_seeds
from train.probes.tasks import PAD, TASKS, ladder_layout, resolve_sizes, two_walks_layout
from tests.seeds import case_seed

SEEDS = (0, 7, case_seed(13))
N = 40


def rows(data):
    for tokens, targets, mask in zip(data.tokens, data.targets, data.mask):
        yield [int(t) for t in tokens], [int(t) for t in targets], [bool(m) for m in mask]


def assert_answers(data, solve):
    """solve(tokens) -> {position: answer} for the scored positions; PAD elsewhere."""
    for tokens, targets, mask in rows(data):
        expected = solve(tokens)
        assert sorted(expected) == [i for i, m in enumerate(mask) if m]
        for i, target in enumerate(targets):
            assert target == expected.get(i, PAD), (tokens, i)


def strip(tokens):
    while tokens and tokens[-1] == PAD:
        tokens = tokens[:-1]
    return tokens


# ------------------------------------------------------------------------------ solvers


def ladder_ids(rungs, num_values):
    """Token id -> ("rung", level, value) | ("dip", j, d) | ("ask", value), from the layout's
    formulas (ladder_layout's docstring)."""
    lay = ladder_layout(rungs, num_values)
    ids = {lay["rung"] + (i - 1) * num_values + v: ("rung", i, v)
           for i in range(1, rungs + 1) for v in range(num_values)}
    ids.update({lay["dip"] + (j - 1) * (j - 2) // 2 + d - 1: ("dip", j, d)
                for j in range(2, rungs + 1) for d in range(1, j)})
    ids.update({lay["ask"] + v: ("ask", v) for v in range(num_values)})
    assert sorted(ids) == list(range(3, lay["vocab_size"]))  # every id used exactly once
    return ids


def solve_ladder(rungs, num_values):
    """Replays the sequence with FPA's rule: field phi = d + 1/2 at DIP(j, d), r + 1 elsewhere;
    level psi = i at RUNG(i, v); a rung written at s is alive at t iff min phi over (s, t] >= psi.
    Checks the write phase: rungs 1..r in order, distinct values, DIP(j, .) right after rung j."""
    ids, lay = ladder_ids(rungs, num_values), ladder_layout(rungs, num_values)

    def solve(tokens):
        parsed = [ids[t] for t in strip(tokens)]
        rung_at = [s for s, p in enumerate(parsed) if p[0] == "rung"]
        assert [parsed[s][1] for s in rung_at] == list(range(1, rungs + 1))
        assert len({parsed[s][2] for s in rung_at}) == rungs
        for s, p in enumerate(parsed):
            if p[0] == "dip":
                assert parsed[s - 1][:2] == ("rung", p[1]) and 1 <= p[2] < p[1]
        assert all(p[0] == "ask" for p in parsed[rung_at[-1] + 2:])
        phi = [p[2] + 0.5 if p[0] == "dip" else rungs + 1 for p in parsed]
        answers = {}
        for t, p in enumerate(parsed):
            if p[0] == "ask":
                s = next(s for s in rung_at if parsed[s][2] == p[1])
                alive = min(phi[s + 1:t + 1]) >= parsed[s][1]
                answers[t] = lay["alive"] if alive else lay["dead"]
        return answers

    return solve


def solve_two_walks(rungs, num_values):
    """Replays the events on explicit alive sets (no running minimum / maximum)."""
    lay = two_walks_layout(rungs, num_values)

    def solve(tokens):
        tokens = strip(tokens)
        writes = tokens[:2 * rungs]
        family_a = [t - lay["a"] for t in writes[0::2]]
        family_b = [t - lay["b"] for t in writes[1::2]]
        assert all(0 <= v < num_values for v in family_a + family_b)
        assert len(set(family_a + family_b)) == 2 * rungs
        alive = {("A", i + 1) for i in range(rungs)} | {("B", i + 1) for i in range(rungs)}
        answers = {}
        for position, t in enumerate(tokens[2 * rungs:], start=2 * rungs):
            if lay["event"] <= t < lay["ask"]:
                depth = t - lay["event"]
                for level in range(1, rungs + 1):   # one of A_level, B_level dies
                    alive.discard(("A", level) if level > depth else ("B", level))
            else:
                assert lay["ask"] <= t < lay["vocab_size"], t
                value = t - lay["ask"]
                rung = (("A", family_a.index(value) + 1) if value in family_a
                        else ("B", family_b.index(value) + 1))
                answers[position] = lay["alive"] if rung in alive else lay["dead"]
        return answers

    return solve


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rungs", [1, 4])
def test_two_walks_matches_brute_force(seed, rungs):
    data = tasks.two_walks(seed, N, rungs=rungs, num_values=2 * rungs + 1, num_events=3,
                           num_queries=7)
    assert_answers(data, solve_two_walks(rungs, 2 * rungs + 1))
    answers = data.targets[data.mask]
    assert {1, 2} <= set(answers)  # both live and dead rungs are asked about
    lay = two_walks_layout(rungs, 2 * rungs + 1)
    assert data.tokens.shape[1] == 2 * rungs + 10 and data.vocab_size == lay["vocab_size"]


def test_two_walks_needs_both_running_minimum_and_maximum():
    """An event of depth d kills A above d and B at or below d: at every level exactly one."""
    lay = two_walks_layout(3, 6)
    data = tasks.two_walks(case_seed(14), 300, rungs=3, num_events=1, num_queries=6)
    for tokens, targets, mask in rows(data):
        depth = next(t - lay["event"] for t in tokens if lay["event"] <= t < lay["ask"])
        event_at = next(i for i, t in enumerate(tokens) if lay["event"] <= t < lay["ask"])
        a_values = [t - lay["a"] for t in tokens[0:6:2]]
        for i in (i for i, m in enumerate(mask) if m and i > event_at):
            value = tokens[i] - lay["ask"]
            level = (a_values.index(value) if value in a_values
                     else [t - lay["b"] for t in tokens[1:6:2]].index(value)) + 1
            a_rung = value in a_values
            assert (targets[i] == lay["alive"]) == ((level <= depth) if a_rung else (level > depth))


def test_unset_sizes_are_resolved_before_they_are_recorded():
    assert resolve_sizes("ladder", {"rungs": 5})["num_values"] == 5
    assert resolve_sizes("two_walks", {"rungs": 3})["num_values"] == 6
    assert resolve_sizes("two_walks", {"rungs": 3, "num_values": 9})["num_values"] == 9
    for name in TASKS:
        assert None not in resolve_sizes(name).values(), name
    with pytest.raises(ValueError, match="unknown size"):
        resolve_sizes("two_walks", {"rung": 2})


def solve_push_pop(num_values):
    lay = tasks.push_pop_layout(num_values)

    def solve(tokens):
        stack, answers = [], {}
        for i, t in enumerate(tokens):
            if t == lay["pop"]:
                stack.pop()
            elif lay["push"] <= t < lay["ask"]:
                stack.append(t - lay["push"])
            elif t >= lay["ask"]:
                answers[i] = lay["on"] if t - lay["ask"] in stack else lay["off"]
        return answers
    return solve


def solve_flip_flop(tokens):
    assert len(tokens) % 2 == 0 and tokens[0] == 1
    answers, last = {}, None
    for i in range(0, len(tokens), 2):
        instruction, bit = tokens[i], tokens[i + 1]
        assert instruction in (1, 2, 3) and bit in (4, 5)
        if instruction == 1:
            last = bit
        elif instruction == 2:
            assert bit == last
            answers[i] = last
    return answers


def solve_counting(num_values):
    def solve(tokens):
        seen = {}
        answers = {}
        for i, t in enumerate(tokens):
            seen[t] = seen.get(t, 0) + 1
            answers[i] = num_values + seen[t]
        return answers

    return solve


def solve_assignment(num_vars, num_values):
    def solve(tokens):
        tokens, store, answers, i = strip(tokens), {}, {}, 0
        while i < len(tokens):
            t = tokens[i]
            if 1 <= t <= num_vars:
                store[t] = tokens[i + 1]
                assert num_vars < store[t] <= num_vars + num_values
                i += 2
            else:
                answers[i] = store[t - num_vars - num_values]
                i += 1
        return answers

    return solve


def solve_mqar(num_pairs, num_keys):
    def solve(tokens):
        store = {}
        for i in range(0, 2 * num_pairs, 2):
            assert 1 <= tokens[i] <= num_keys < tokens[i + 1]
            store[tokens[i]] = tokens[i + 1]
        return {i: store[t] for i, t in enumerate(tokens) if i >= 2 * num_pairs}

    return solve


# ------------------------------------------------------------------------------ generator tests


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rungs", [1, 2, 5])
def test_ladder_matches_fpa_replay(seed, rungs):
    data = tasks.ladder(seed, N, rungs=rungs, num_values=rungs + 2)
    assert_answers(data, solve_ladder(rungs, rungs + 2))
    assert data.vocab_size == ladder_layout(rungs, rungs + 2)["vocab_size"]
    if rungs > 1:
        assert {1, 2} <= set(data.targets[data.mask])  # both live and dead keys are asked about


def ladder_live_set(tokens, targets, rungs):
    """The levels of the rungs answered ALIVE (`ladder` asks about every rung once)."""
    parsed = [ladder_ids(rungs, rungs).get(t) for t in tokens]
    level = {p[2]: p[1] for p in parsed if p and p[0] == "rung"}
    return frozenset(level[p[1]] for p, target in zip(parsed, targets)
                     if p and p[0] == "ask" and target == ladder_layout(rungs, rungs)["alive"])


def test_ladder_makes_every_live_set():
    """All 2^(r-1) live sets that contain the ground rung occur, and no other (r = 5)."""
    rungs = 5
    data = tasks.ladder(case_seed(15), 600, rungs=rungs)
    live_sets = Counter(ladder_live_set(tokens, targets, rungs) for tokens, targets, _ in rows(data))
    expected = {frozenset([1] + [level for level, keep in zip(range(2, rungs + 1), bits) if keep])
                for bits in itertools.product((False, True), repeat=rungs - 1)}
    assert set(live_sets) == expected
    assert min(live_sets.values()) >= 10  # about 600 / 16 each


@pytest.mark.parametrize("rungs", [3, 4])
def test_ladder_answers_are_functions_of_the_bag(rungs):
    """A one-layer head without positions sees the query and the multiset of earlier tokens:
    the answers must be a function of those (order-blind ceiling 1), or NoPE could not solve
    the ladder, as the paper has it do at r = 6. Small r, so bags repeat in the sample."""
    data = tasks.ladder(case_seed(16), 3000, rungs=rungs)
    assert tasks.order_blind_ceiling(data) == 1.0


def test_push_pop_order_blind_ceiling_is_below_its_threshold():
    """The paper has position-free one-layer models fail push-pop: membership depends on the
    order of pushes and pops, so no function of the bag can pass the threshold. Measured
    exactly (every bag grouped) at sizes small enough for bags to repeat."""
    threshold = TASKS["push_pop"].threshold
    for sizes in (dict(length=8, num_values=2, max_depth=3, num_queries=2),
                  dict(length=8, num_values=3, max_depth=3, num_queries=2)):
        small = tasks.push_pop(case_seed(17), 20000, **sizes)
        assert tasks.order_blind_ceiling(small) < threshold - 0.04, sizes


def test_push_pop_asks_balanced_and_about_popped_values():
    """About half the answers are ON; OFF answers are always about values pushed and popped,
    never about values not seen (which a bag would answer)."""
    data = tasks.push_pop(case_seed(19), 400)
    lay = tasks.push_pop_layout(8)
    on = data.targets[data.mask] == lay["on"]
    assert 0.4 < on.mean() < 0.6
    seen = [t - lay["ask"] + lay["push"] in row[:i]
            for row, mask, target in zip(data.tokens, data.mask, data.targets)
            for i in np.flatnonzero(mask) for t in [row[i]] if target[i] == lay["off"]]
    assert seen and all(seen)


def test_push_pop_live_keys_of_the_stack_form_are_the_stack():
    """docs/experiments.md's construction: walk W = depth (+1 at PUSH, -1 at POP), field
    phi = W, level psi_s = W_s. FPA's dense bias is 0 on exactly the PUSH keys still on the
    stack at each ASK and negative on the popped ones."""
    from fpa_jax import fields, fpa_bias
    lay = tasks.push_pop_layout(5)
    data = tasks.push_pop(case_seed(20), 8, length=20, num_values=5, max_depth=4)
    tokens = data.tokens
    is_push = (tokens >= lay["push"]) & (tokens < lay["ask"])
    delta = np.where(is_push, 1.0, np.where(tokens == lay["pop"], -1.0, 0.0))[..., None]
    zero = np.zeros_like(delta)
    phi, psi = fields(delta.astype(np.float32), zero, zero)
    bias = np.asarray(fpa_bias(phi, psi, np.ones(1, np.float32)))[:, 0]
    for row in range(len(tokens)):
        stack = []                       # positions of the pushes on the stack
        for t, token in enumerate(tokens[row]):
            if token == lay["pop"]:
                stack.pop()
            elif is_push[row, t]:
                stack.append(t)
            elif data.mask[row, t]:
                pushes = np.flatnonzero(is_push[row, :t])
                alive = set(np.flatnonzero(bias[row, t, :t] == 0.0)) & set(pushes)
                assert alive == set(stack), (row, t)


@pytest.mark.parametrize("seed", SEEDS)
def test_push_pop_flip_flop_copy_counting_match_brute_force(seed):
    assert_answers(tasks.push_pop(seed, N, length=19, num_values=5, max_depth=3),
                   solve_push_pop(5))
    assert_answers(tasks.flip_flop(seed, N, num_pairs=13), solve_flip_flop)
    data = tasks.copy(seed, N, length=5, num_values=3)
    assert_answers(data, lambda t: {5 + j: t[j] for j in range(5)} if t[5] == 1 else {})
    assert_answers(tasks.counting(seed, N, length=11, num_values=3, max_count=4), solve_counting(3))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("overwrite", [0, 1])
def test_assignment_and_mqar_match_brute_force(seed, overwrite):
    assert_answers(tasks.variable_assignment(seed, N, length=17, num_vars=3, num_values=5),
                   solve_assignment(3, 5))
    data = tasks.mqar(seed, N, num_pairs=6, num_queries=5, num_keys=9, num_values=7,
                      overwrite=overwrite)
    assert_answers(data, solve_mqar(6, 9))
    distinct = [len(set(t[0:12:2])) for t in data.tokens.tolist()]
    if overwrite:
        assert min(distinct) < 6  # some keys were re-assigned
    else:
        assert distinct == [6] * N


@pytest.mark.parametrize("name", sorted(TASKS))
def test_generators_are_pure_and_in_vocab(name):
    generate = TASKS[name].generate
    a, b, c = generate(5, 12), generate(5, 12), generate(6, 12)
    for x, y in zip(a[:3], b[:3]):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.tokens, c.tokens)
    assert a.tokens.dtype == np.int32 and a.mask.dtype == bool and a.mask.any()
    assert 0 <= a.tokens.min() and a.tokens.max() < a.vocab_size
    assert a.targets.max() < a.vocab_size and (a.targets[a.mask] != PAD).all()
    assert (a.targets[~a.mask] == PAD).all()


def test_generators_reject_bad_sizes():
    with pytest.raises(ValueError, match="rungs"):
        tasks.ladder(0, 4, rungs=0)
    with pytest.raises(ValueError, match="num_values"):
        tasks.ladder(0, 4, rungs=6, num_values=3)
    with pytest.raises(ValueError, match="ground"):
        tasks.ladder_dips(np.random.default_rng(0), [True, False])
    with pytest.raises(ValueError, match="num_pairs"):
        tasks.mqar(0, 4, num_pairs=9, num_keys=4)


# ------------------------------------------------------------------------------ runner


TINY = dict(steps=4, eval_every=2, batch_size=4, model_dim=8, mlp=False, train_size=16,
            test_size=8, head_dim=2)
TINY_SIZES = dict(rungs=3, num_values=4)


@pytest.mark.slow
def test_cli_writes_outputs_and_vmap_equals_seeds_one_by_one(tmp_path, capsys):
    from train.cli.entry import main

    args = ["probe", "ladder", "seeds=2", "methods=fpa", f"out={tmp_path}"]
    args += [f"{k}={v}" for k, v in {**TINY, **TINY_SIZES}.items()]
    assert main(args) == 0
    assert "fpa" in capsys.readouterr().out
    result = json.loads((tmp_path / "probe.json").read_text())
    assert (tmp_path / "probe.png").stat().st_size > 0
    with (tmp_path / "probe.csv").open() as handle:
        assert [row["method"] for row in csv.DictReader(handle)] == ["fpa"]
    assert result["fisher"] == {} and result["sign_test"] == {}  # the reference alone
    run = result["methods"]["fpa"]
    assert np.shape(run["accuracy_curves"]) == (2, 2) and result["sizes"]["rungs"] == 3
    assert result["sizes"]["num_values"] == 4 and None not in result["sizes"].values()

    for seed in (0, 1):
        alone = train_seeds("fpa", "ladder", TINY_SIZES,
                            ProbeConfig(seeds=1, first_seed=seed, **TINY))
        np.testing.assert_allclose(alone["loss"][0], run["loss_curves"][seed], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(alone["accuracy"][0], run["accuracy_curves"][seed], atol=1e-6)
    assert run["loss_curves"][0] != run["loss_curves"][1]  # seeds differ

    # the accuracy by position: null where no held-out sequence is scored, and its mean
    # weighted by the scored sequences is the final accuracy
    for seed, by_position in enumerate(run["final_accuracy_by_position"]):
        _, test = seed_data("ladder", [seed], resolve_sizes("ladder", TINY_SIZES),
                            ProbeConfig(seeds=1, **TINY))
        scored = test.mask[0].sum(axis=0)
        assert len(by_position) == len(scored)
        assert [a is None for a in by_position] == list(scored == 0)
        weighted = sum(a * n for a, n in zip(by_position, scored) if a is not None)
        assert weighted / scored.sum() == pytest.approx(run["final_accuracy"][seed], abs=1e-6)


def test_runner_rejects_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        run_probe("ladder", ["nope"], ProbeConfig(**TINY))
    with pytest.raises(ValueError, match="unknown size"):
        run_probe("ladder", ["fpa"], ProbeConfig(**TINY), {"rung": 3})
    with pytest.raises(ValueError, match="multiple"):
        ProbeConfig(steps=5, eval_every=2)
    with pytest.raises(ValueError, match="task"):
        run_probe("nope", ["fpa"], ProbeConfig(**TINY))


def test_cli_lists_tasks_and_rejects_bad_keys(capsys):
    from train.cli.entry import main

    assert main(["probe", "list"]) == 0
    assert "ladder" in capsys.readouterr().out
    assert main(["probe", "ladder", "rung=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "unknown key 'rung'" in err[0]
    assert main(["probe", "ladder", "steps=x"]) == 2
    assert main(["probe"]) == 2


def test_two_walks_defaults_to_two_heads_of_dim_two():
    from train.probes.cli import parse_arguments

    _, _, _, _, config, sizes = parse_arguments(["two_walks", "rungs=2"])
    assert (config.num_heads, config.head_dim) == (2, 2) and sizes == {"rungs": 2}
    _, _, _, _, config, _ = parse_arguments(["two_walks", "num_heads=1"])
    assert (config.num_heads, config.head_dim) == (1, 2)
    _, _, _, _, config, _ = parse_arguments(["ladder"])
    assert (config.num_heads, config.head_dim) == (1, 4)


def test_token_shift_starts_as_the_plain_model_and_reaches_the_previous_token():
    """token_shift adds s * h_{t-1} before each attention with s initialised to 0: at init the
    logits equal the model without it; with s != 0 a one-layer position-free model's output at
    t changes with the token at t - 1 (without the shift it sees only the bag)."""
    import jax
    import jax.numpy as jnp
    from train.probes.model import build_model

    sizes = dict(model_dim=8, num_layers=1, num_heads=1, head_dim=4)
    plain = build_model("softmax_nope", 10, **sizes)
    shifted = build_model("softmax_nope", 10, token_shift=True, **sizes)
    tokens = np.random.default_rng(case_seed(21)).integers(1, 10, (2, 6))
    tokens[:, 3] = tokens[:, 2] % 9 + 1      # the tokens swapped below differ
    tokens = jnp.asarray(tokens)
    params = shifted.init(jax.random.PRNGKey(case_seed(22)), tokens)
    assert float(jnp.abs(params["params"]["shift_0"]).max()) == 0.0
    without = {"params": {k: v for k, v in params["params"].items() if k != "shift_0"}}
    np.testing.assert_array_equal(shifted.apply(params, tokens), plain.apply(without, tokens))

    params["params"]["shift_0"] = jnp.ones(8)
    swapped = tokens.at[:, 2:4].set(tokens[:, 3:1:-1])       # same bag at t = 4, new t - 1
    changed = lambda model, p: float(jnp.abs(model.apply(p, tokens)[:, 4]
                                             - model.apply(p, swapped)[:, 4]).max())
    assert changed(plain, without) < 1e-5
    assert changed(shifted, params) > 1e-3
