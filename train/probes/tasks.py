"""Synthetic probe tasks: pure generators of (tokens, targets, mask) from a seed and sizes.

    generator(seed, num_sequences, **sizes) -> ProbeData
    tokens  int32 [N, T]   the input sequence (0 = PAD at the end of short sequences)
    targets int32 [N, T]   the token id the model must output at each position (causal: the
                           answer at position t may use tokens[<= t] only)
    mask    bool  [N, T]   positions that are scored (held-out accuracy = mean over mask)

Answers are token ids of the task's own vocabulary (`vocab_size`), so one output head of size
vocab_size serves every task. Every generator draws from np.random.default_rng(seed) only, so
equal arguments give equal data. Each docstring states the task and its id layout exactly; a
task's threshold in TASKS is the held-out accuracy a seed must exceed to count as a success.
"""

from __future__ import annotations

import inspect
from typing import Callable, NamedTuple

import numpy as np

PAD = 0


class ProbeData(NamedTuple):
    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    vocab_size: int


def _check_sizes(task: str, **sizes) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{task}: {name} must be a positive int, got {value!r}")


def _pack(rows: list[tuple[list[int], list[int], list[bool]]], vocab_size: int) -> ProbeData:
    """Right-pads variable-length rows with PAD (target PAD, unscored)."""
    length = max(len(tokens) for tokens, _, _ in rows)
    tokens = np.zeros((len(rows), length), np.int32)
    targets = np.zeros((len(rows), length), np.int32)
    mask = np.zeros((len(rows), length), bool)
    for i, (tok, tgt, msk) in enumerate(rows):
        tokens[i, :len(tok)] = tok
        targets[i, :len(tgt)] = tgt
        mask[i, :len(msk)] = msk
    return ProbeData(tokens, targets, mask, vocab_size)


# ----------------------------------------------------------------------------------------------
# Ladder / live-key sets
# ----------------------------------------------------------------------------------------------


def ladder_layout(rungs: int, num_values: int) -> dict[str, int]:
    """Id offsets of `ladder` (r rungs, V values): PAD 0, DEAD 1, ALIVE 2,
    RUNG(i, v) = 3 + (i-1) V + v (level i in 1..r, value v < V),
    DIP(j, d) = 3 + r V + (j-1)(j-2)/2 + d - 1 (1 <= d < j <= r: after rung j, down to d),
    ASK(v) = 3 + r V + r (r-1)/2 + v; vocab_size = ASK(V)."""
    rung = 3
    dip = rung + rungs * num_values
    ask = dip + rungs * (rungs - 1) // 2
    return {"dead": 1, "alive": 2, "rung": rung, "dip": dip, "ask": ask,
            "vocab_size": ask + num_values}


def ladder_dips(rng: np.random.Generator, dead: list[bool]) -> list[tuple[int, int]]:
    """Dips (j, d) that kill exactly the rungs marked in `dead` (dead[i - 1]: rung i).

    DIP(j, d) kills the rungs at levels d < i <= j, so it may follow only a dead rung j and
    fall no lower than the highest live rung below j (`top`). Walking up the rungs: a dead rung
    that ends its run of dead rungs (rung j + 1 alive, or j = r) is followed by DIP(j, top),
    which kills the whole run; any other dead rung, with probability 1/2, by DIP(j, d) with d
    uniform in top..j-1 (part of the run dies early; later dips may kill it again). Rung 1, the
    ground, must be alive.
    """
    if dead[0]:
        raise ValueError("ladder_dips: the ground rung (dead[0]) must be alive")
    dips, top = [], 1
    for j in range(2, len(dead) + 1):
        if not dead[j - 1]:
            top = j
        elif j == len(dead) or not dead[j]:
            dips.append((j, top))
        elif rng.random() < 0.5:
            dips.append((j, int(rng.integers(top, j))))
    return dips


def _ladder_row(rng, rungs, num_values):
    lay = ladder_layout(rungs, num_values)
    values = rng.choice(num_values, size=rungs, replace=False)
    dead = [False] + [bool(x) for x in rng.random(rungs - 1) < 0.5]
    dip_after = dict(ladder_dips(rng, dead))
    tokens = []
    for level, value in enumerate(values, start=1):
        tokens.append(lay["rung"] + (level - 1) * num_values + int(value))
        if level in dip_after:
            depth = dip_after[level]
            tokens.append(lay["dip"] + (level - 1) * (level - 2) // 2 + depth - 1)
    asked = rng.permutation(rungs)  # 0-based levels, each rung asked once
    return (tokens + [lay["ask"] + int(values[i]) for i in asked],
            [PAD] * len(tokens) + [lay["dead"] if dead[i] else lay["alive"] for i in asked],
            [False] * len(tokens) + [True] * rungs)


def ladder(seed: int, num_sequences: int, rungs: int = 6, num_values: int | None = None
           ) -> ProbeData:
    """Ladder / live-key sets: which rungs survive the dips written after them.

    Write phase, rung by rung: RUNG(i, v_i) for i = 1..r (level i, value v_i; the v_i distinct,
    uniform from num_values symbols; None: num_values = r, a permutation), each followed by at
    most one dip DIP(i, d), 1 <= d < i: the level falls to d right after rung i, killing for
    good the rungs d < k <= i. Rung 1 (the ground) never dies. The dead set is drawn first,
    each rung 2..r dead with probability 1/2 (so each of the 2^(r-1) live sets containing the
    ground has probability 2^-(r-1)), then dips that kill exactly it (`ladder_dips`). Then r
    queries ASK(v_i), every rung once in random order, each scored: target ALIVE if rung i is
    alive, else DEAD. Every token states its levels, so the answer is a function of the query
    and the multiset of earlier tokens (order is not needed). Layout: ladder_layout(r,
    num_values); docs/experiments.md explains the format.
    """
    num_values = rungs if num_values is None else num_values
    _check_sizes("ladder", num_sequences=num_sequences, rungs=rungs, num_values=num_values)
    if num_values < rungs:
        raise ValueError(f"ladder: num_values must be >= rungs ({rungs}), got {num_values}")
    rng = np.random.default_rng(seed)
    rows = [_ladder_row(rng, rungs, num_values) for _ in range(num_sequences)]
    return _pack(rows, ladder_layout(rungs, num_values)["vocab_size"])


def order_blind_ceiling(data: ProbeData) -> float:
    """The best accuracy on `data` of any predictor that sees, at each scored position t, only
    tokens[t] and the multiset of tokens[<= t] (a one-layer attention head without positions
    or gates sees no more). Exact on this sample: each (token, bag) group is answered with its
    most frequent target, so no order-blind model can score higher on `data`."""
    groups: dict[tuple, dict[int, int]] = {}
    for tokens, targets, mask in zip(data.tokens, data.targets, data.mask):
        for t in np.flatnonzero(mask):
            key = (int(tokens[t]), np.bincount(tokens[:t + 1], minlength=data.vocab_size).tobytes())
            counts = groups.setdefault(key, {})
            counts[int(targets[t])] = counts.get(int(targets[t]), 0) + 1
    total = sum(sum(c.values()) for c in groups.values())
    return sum(max(c.values()) for c in groups.values()) / max(total, 1)


# ----------------------------------------------------------------------------------------------
# Variable-duration dips
# ----------------------------------------------------------------------------------------------


def variable_dips_layout(rungs: int, num_values: int) -> dict[str, int]:
    """Id offsets of `variable_dips`: PAD 0, DEAD 1, ALIVE 2, VAL(v) = 3 + v, ASK(v) =
    4 + V + r + v, DOWN, HOLD, UP after those (ids 3 + V .. 3 + V + r are unused)."""
    val = 3
    ask = val + num_values + rungs + 1
    down = ask + num_values
    return {"dead": 1, "alive": 2, "val": val, "ask": ask,
            "down": down, "hold": down + 1, "up": down + 2, "vocab_size": down + 3}


def _variable_dips_row(rng, rungs, num_values, num_dips, num_queries):
    layout = variable_dips_layout(rungs, num_values)
    values = rng.choice(num_values, size=rungs, replace=False)
    tokens = [layout["val"] + int(v) for v in values]
    targets = [PAD] * rungs
    mask = [False] * rungs
    events = np.array([True] * num_dips + [False] * num_queries)
    rng.shuffle(events)
    lowest = rungs  # the deepest level reached so far; rung i (1-based) is alive iff i <= lowest
    for is_dip in events:
        if is_dip:
            depth = int(rng.integers(0, rungs + 1))
            lowest = min(lowest, depth)
            hold = int(rng.integers(1, 3))
            steps = rungs - depth
            dip = [layout["down"]] * steps + [layout["hold"]] * (hold - 1) + [layout["up"]] * steps
            tokens += dip
            targets += [PAD] * len(dip)
            mask += [False] * len(dip)
        else:
            rung = int(rng.integers(0, rungs))  # 0-based: rung index rung + 1
            tokens.append(layout["ask"] + int(values[rung]))
            targets.append(layout["alive"] if rung + 1 <= lowest else layout["dead"])
            mask.append(True)
    return tokens, targets, mask


def variable_dips(seed: int, num_sequences: int, rungs: int = 6, num_values: int | None = None,
                  num_dips: int = 3, num_queries: int = 8) -> ProbeData:
    """Variable-duration dips: which written rungs survive dips written as unit steps.

    Write phase: r rung tokens VAL(v_1) .. VAL(v_r), v_i distinct, uniform from num_values
    symbols (None: num_values = r, a permutation); rung i sits at level i. Then num_dips dips
    and num_queries query tokens in random order. A dip to depth d (uniform in {0, .., r}) is
    the tokens DOWN^(r-d), HOLD^(k-1), UP^(r-d) with k uniform in {1, 2}: the level falls by
    one per DOWN from r, stays at its deepest value d for k tokens (the last DOWN plus k-1
    HOLDs), and climbs back by one per UP. A rung i dies for good once the level falls below i.
    ASK(v_i), i uniform in 1..r, is scored: target ALIVE if i <= min(r, depths of the dips so
    far), else DEAD; queries occur only between dips. Layout: variable_dips_layout(r,
    num_values).
    """
    num_values = rungs if num_values is None else num_values
    _check_sizes("variable_dips", num_sequences=num_sequences, rungs=rungs,
                 num_values=num_values, num_dips=num_dips, num_queries=num_queries)
    if num_values < rungs:
        raise ValueError(f"variable_dips: num_values must be >= rungs ({rungs}), got {num_values}")
    rng = np.random.default_rng(seed)
    rows = [_variable_dips_row(rng, rungs, num_values, num_dips, num_queries)
            for _ in range(num_sequences)]
    return _pack(rows, variable_dips_layout(rungs, num_values)["vocab_size"])


# ----------------------------------------------------------------------------------------------
# Two complementary walk families
# ----------------------------------------------------------------------------------------------


def two_walks_layout(rungs: int, num_values: int) -> dict[str, int]:
    """Id offsets of two_walks: PAD 0, DEAD 1, ALIVE 2, A(v) = 3 + v, B(v) = 3 + V + v,
    EVENT(d) = 3 + 2V + d (d = 0..r), ASK(v) = 4 + 2V + r + v; vocab_size = 4 + 3V + r."""
    a, b = 3, 3 + num_values
    event = b + num_values
    ask = event + rungs + 1
    return {"dead": 1, "alive": 2, "a": a, "b": b, "event": event, "ask": ask,
            "vocab_size": ask + num_values}


def two_walks(seed: int, num_sequences: int, rungs: int = 4, num_values: int | None = None,
              num_events: int = 2, num_queries: int = 8) -> ProbeData:
    """Two complementary walk families: one event kills family A from above, B from below.

    Write phase: 2r tokens A(a_1) B(b_1) A(a_2) B(b_2) .. A(a_r) B(b_r), the 2r values a_i, b_j
    distinct, uniform from num_values symbols (None: num_values = 2r, a permutation); rung i of
    either family sits at level i. Then num_events event tokens and num_queries query tokens in
    random order. EVENT(d), d uniform in {0, .., r}, kills for good every A rung with i > d and
    every B rung with j <= d (so each event kills exactly one of A_i, B_i at every level i).
    ASK(v) of a written value v (uniform over the 2r rungs) is scored: target ALIVE if the rung
    is alive, i.e. A_i: i <= min(r, depths of the events so far); B_j: j > max(0, those
    depths); else DEAD. Layout: two_walks_layout(r, num_values).

    One walk cannot serve both families (A needs the running minimum of the depths, B the
    running maximum); two heads whose walks move in opposite directions can.
    """
    num_values = 2 * rungs if num_values is None else num_values
    _check_sizes("two_walks", num_sequences=num_sequences, rungs=rungs, num_values=num_values,
                 num_events=num_events, num_queries=num_queries)
    if num_values < 2 * rungs:
        raise ValueError(f"two_walks: num_values must be >= 2 * rungs ({2 * rungs}), "
                         f"got {num_values}")
    layout = two_walks_layout(rungs, num_values)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_sequences):
        values = rng.choice(num_values, size=2 * rungs, replace=False)
        a_values, b_values = values[:rungs], values[rungs:]
        tokens = [t for i in range(rungs)
                  for t in (layout["a"] + int(a_values[i]), layout["b"] + int(b_values[i]))]
        targets, mask = [PAD] * len(tokens), [False] * len(tokens)
        events = np.array([True] * num_events + [False] * num_queries)
        rng.shuffle(events)
        lowest, highest = rungs, 0   # running min / max of the event depths
        for is_event in events:
            if is_event:
                depth = int(rng.integers(0, rungs + 1))
                lowest, highest = min(lowest, depth), max(highest, depth)
                tokens.append(layout["event"] + depth)
                targets.append(PAD)
                mask.append(False)
            else:
                rung = int(rng.integers(0, 2 * rungs))
                if rung < rungs:    # family A, rung index rung + 1
                    alive, value = rung + 1 <= lowest, a_values[rung]
                else:               # family B, rung index rung - rungs + 1
                    alive, value = rung - rungs + 1 > highest, b_values[rung - rungs]
                tokens.append(layout["ask"] + int(value))
                targets.append(layout["alive"] if alive else layout["dead"])
                mask.append(True)
        rows.append((tokens, targets, mask))
    return _pack(rows, layout["vocab_size"])


# ----------------------------------------------------------------------------------------------
# Push-pop
# ----------------------------------------------------------------------------------------------


def push_pop_layout(num_values: int) -> dict[str, int]:
    """Id offsets of `push_pop`: PAD 0, OFF 1, ON 2, POP 3, PUSH(v) = 4 + v, ASK(v) = 4 + V + v;
    vocab_size = 4 + 2V."""
    return {"off": 1, "on": 2, "pop": 3, "push": 4, "ask": 4 + num_values,
            "vocab_size": 4 + 2 * num_values}


def push_pop(seed: int, num_sequences: int, length: int = 24, num_values: int = 8,
             max_depth: int = 8, num_queries: int = 8) -> ProbeData:
    """Push-pop: is a value on a stack that pushes and pops?

    `length` stack operations: PUSH(v) (v uniform) with probability 1/2, else POP; an empty
    stack always pushes and a full one (max_depth) always pops. num_queries ASK(v) tokens sit
    at uniformly random places after the first operation and leave the stack alone. ASK(v) is
    scored: target ON if v is on the stack (a PUSH(v) not popped since), else OFF. With
    probability 1/2 v is drawn from the values on the stack, else from those pushed and since
    popped off it (when one set is empty, from the other; the first operation is a PUSH, so
    both are never empty). Layout: push_pop_layout(num_values).

    A key pushed at depth i is on the stack until the depth falls below i: with the walk
    W = depth (delta +1 at PUSH, -1 at POP), field phi = W and level psi_s = W_s, FPA's live
    keys are exactly the stack (docs/experiments.md).
    """
    _check_sizes("push_pop", num_sequences=num_sequences, length=length,
                 num_values=num_values, max_depth=max_depth, num_queries=num_queries)
    layout = push_pop_layout(num_values)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_sequences):
        events = np.array([False] * (length - 1) + [True] * num_queries)
        rng.shuffle(events)
        stack, popped, tokens, targets, mask = [], set(), [], [], []
        for is_query in [False, *events]:
            if is_query:
                on, off = set(stack), popped - set(stack)
                pick_on = bool(on) and (not off or rng.random() < 0.5)
                pool = sorted(on if pick_on else off)   # never empty: a PUSH comes first
                value = int(rng.choice(pool))
                tokens.append(layout["ask"] + value)
                targets.append(layout["on"] if value in on else layout["off"])
                mask.append(True)
                continue
            push = (not stack) or (len(stack) < max_depth and rng.random() < 0.5)
            if push:
                value = int(rng.integers(num_values))
                stack.append(value)
                tokens.append(layout["push"] + value)
            else:
                popped.add(stack.pop())
                tokens.append(layout["pop"])
            targets.append(PAD)
            mask.append(False)
        rows.append((tokens, targets, mask))
    return _pack(rows, layout["vocab_size"])


# ----------------------------------------------------------------------------------------------
# Flip-flop, copy, counting
# ----------------------------------------------------------------------------------------------


def flip_flop(seed: int, num_sequences: int, num_pairs: int = 16, p_write: int | float = 0.2,
              p_read: int | float = 0.2) -> ProbeData:
    """Flip-flop language: recall the last written bit at every read.

    Ids: PAD 0, WRITE 1, READ 2, IGNORE 3, ZERO 4, ONE 5. A sequence is num_pairs pairs
    (instruction, bit); the first instruction is WRITE, later ones WRITE / READ / IGNORE with
    probabilities p_write, p_read, 1 - p_write - p_read. Bits after WRITE and IGNORE are
    uniform; the bit after READ equals the last written bit. Scored at READ positions (the
    model predicts the next token): target = ZERO/ONE of the last written bit.
    """
    _check_sizes("flip_flop", num_sequences=num_sequences, num_pairs=num_pairs)
    if not (0 < p_write and 0 <= p_read and p_write + p_read <= 1):
        raise ValueError(f"flip_flop: need 0 < p_write, 0 <= p_read, p_write + p_read <= 1, "
                         f"got {p_write}, {p_read}")
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_sequences):
        tokens, targets, mask, last = [], [], [], 0
        for pair in range(num_pairs):
            draw = rng.random()
            instruction = 1 if pair == 0 or draw < p_write else (2 if draw < p_write + p_read else 3)
            bit = int(rng.integers(2))
            if instruction == 1:
                last = bit
            elif instruction == 2:
                bit = last
            tokens += [instruction, 4 + bit]
            targets += [4 + bit if instruction == 2 else PAD, PAD]
            mask += [instruction == 2, False]
        rows.append((tokens, targets, mask))
    return _pack(rows, 6)


def copy(seed: int, num_sequences: int, length: int = 8, num_values: int = 8) -> ProbeData:
    """Copy: repeat a random string after a separator.

    Ids: PAD 0, SEP 1, SYM(v) = 2 + v. Tokens x_1 .. x_n SEP x_1 .. x_{n-1} (n = length, x_i
    uniform over num_values). Scored at SEP and the copied positions: the target at SEP is
    x_1 and at the j-th copied token (x_j) it is x_{j+1}.
    """
    _check_sizes("copy", num_sequences=num_sequences, length=length, num_values=num_values)
    rng = np.random.default_rng(seed)
    symbols = 2 + rng.integers(num_values, size=(num_sequences, length))
    sep = np.ones((num_sequences, 1), np.int64)
    tokens = np.concatenate([symbols, sep, symbols[:, :-1]], axis=1).astype(np.int32)
    targets = np.zeros_like(tokens)
    targets[:, length:] = symbols
    mask = np.zeros(tokens.shape, bool)
    mask[:, length:] = True
    return ProbeData(tokens, targets, mask, 2 + num_values)


def counting(seed: int, num_sequences: int, length: int = 24, num_values: int = 4,
             max_count: int = 8) -> ProbeData:
    """Counting: how many times has the current symbol occurred so far (itself included)?

    Ids: PAD 0, SYM(v) = 1 + v (v < num_values), COUNT(c) = num_values + c (c = 1..max_count).
    Each token is uniform over the symbols whose count is still below max_count. Scored at
    every position: target COUNT(#{u <= t : x_u = x_t}).
    """
    _check_sizes("counting", num_sequences=num_sequences, length=length,
                 num_values=num_values, max_count=max_count)
    if length > num_values * max_count:
        raise ValueError(f"counting: length must be <= num_values * max_count "
                         f"({num_values * max_count}), got {length}")
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_sequences):
        counts = np.zeros(num_values, int)
        tokens, targets = [], []
        for _ in range(length):
            value = int(rng.choice(np.flatnonzero(counts < max_count)))
            counts[value] += 1
            tokens.append(1 + value)
            targets.append(num_values + int(counts[value]))
        rows.append((tokens, targets, [True] * length))
    return _pack(rows, 1 + num_values + max_count)


# ----------------------------------------------------------------------------------------------
# Variable assignment and multi-query associative recall
# ----------------------------------------------------------------------------------------------


def variable_assignment(seed: int, num_sequences: int, length: int = 32, num_vars: int = 4,
                        num_values: int = 8) -> ProbeData:
    """Variable assignment with re-assignment: answer a variable's current value.

    Ids: PAD 0, VAR(i) = 1 + i (i < num_vars), VAL(v) = 1 + num_vars + v, ASK(i) =
    1 + num_vars + num_values + i. Events until `length` tokens: with probability 1/2 (always
    while nothing is assigned) an assignment VAR(i) VAL(v) (i, v uniform; re-assigning
    overwrites), else a query ASK(i) for i uniform among the assigned variables. A trailing
    single slot holds a query, or PAD if none can be asked. Scored at ASK: target VAL(latest v).
    """
    _check_sizes("variable_assignment", num_sequences=num_sequences, length=length,
                 num_vars=num_vars, num_values=num_values)
    rng = np.random.default_rng(seed)
    ask = 1 + num_vars + num_values
    rows = []
    for _ in range(num_sequences):
        store, tokens, targets, mask = {}, [], [], []
        while len(tokens) < length:
            room = length - len(tokens)
            if store and (room == 1 or rng.random() < 0.5):
                var = int(rng.choice(sorted(store)))
                tokens.append(ask + var)
                targets.append(1 + num_vars + store[var])
                mask.append(True)
            elif room >= 2:
                var, value = int(rng.integers(num_vars)), int(rng.integers(num_values))
                store[var] = value
                tokens += [1 + var, 1 + num_vars + value]
                targets += [PAD, PAD]
                mask += [False, False]
            else:
                break
        rows.append((tokens, targets, mask))
    return _pack(rows, ask + num_vars)


def mqar(seed: int, num_sequences: int, num_pairs: int = 8, num_queries: int = 8,
         num_keys: int = 16, num_values: int = 16, overwrite: int | bool = 0) -> ProbeData:
    """Multi-query associative recall (MQAR), optionally with overwrites.

    Ids: PAD 0, KEY(k) = 1 + k (k < num_keys), VAL(v) = 1 + num_keys + v. Context: num_pairs
    pairs KEY(k) VAL(v), v uniform. Without overwrite the keys are distinct (uniform without
    replacement); with overwrite each pair after the first re-uses an earlier key with
    probability 1/2 (then its value is redrawn). Then num_queries tokens KEY(k), k uniform over
    the context's keys, each scored: target VAL(value of k's latest pair).
    """
    _check_sizes("mqar", num_sequences=num_sequences, num_pairs=num_pairs,
                 num_queries=num_queries, num_keys=num_keys, num_values=num_values)
    if num_pairs > num_keys:
        raise ValueError(f"mqar: num_pairs must be <= num_keys ({num_keys}), got {num_pairs}")
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_sequences):
        fresh = list(rng.permutation(num_keys))
        store, tokens = {}, []
        for pair in range(num_pairs):
            if overwrite and pair > 0 and rng.random() < 0.5:
                key = int(rng.choice(sorted(store)))
            else:
                key = int(fresh.pop())
            store[key] = int(rng.integers(num_values))
            tokens += [1 + key, 1 + num_keys + store[key]]
        keys = sorted(store)
        queries = [int(keys[i]) for i in rng.integers(len(keys), size=num_queries)]
        rows.append((tokens + [1 + k for k in queries],
                     [PAD] * len(tokens) + [1 + num_keys + store[k] for k in queries],
                     [False] * len(tokens) + [True] * num_queries))
    return _pack(rows, 1 + num_keys + num_values)


class Task(NamedTuple):
    generate: Callable[..., ProbeData]
    threshold: float  # held-out accuracy a seed must exceed to count as a success
    config: dict = {}  # ProbeConfig defaults `python -m train probe` uses (keys override)


TASKS: dict[str, Task] = {
    "ladder": Task(ladder, 0.95),
    "variable_dips": Task(variable_dips, 0.95),
    "two_walks": Task(two_walks, 0.95, {"num_heads": 2, "head_dim": 2}),
    "push_pop": Task(push_pop, 0.95),
    "flip_flop": Task(flip_flop, 0.99),
    "copy": Task(copy, 0.95),
    "counting": Task(counting, 0.95),
    "variable_assignment": Task(variable_assignment, 0.95),
    "mqar": Task(mqar, 0.9),
}


def task_sizes(name: str) -> dict[str, object]:
    """The size keywords (and defaults) of task `name`'s generator (None: derived from the
    other sizes, see `resolve_sizes`)."""
    if name not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {name!r}")
    params = inspect.signature(TASKS[name].generate).parameters
    return {key: p.default for key, p in params.items() if key not in ("seed", "num_sequences")}


# Sizes whose default None is derived from the others (as each generator's docstring says).
_DERIVED_SIZES: dict[str, Callable[[dict], dict]] = {
    "ladder": lambda s: {"num_values": s["rungs"]},
    "variable_dips": lambda s: {"num_values": s["rungs"]},
    "two_walks": lambda s: {"num_values": 2 * s["rungs"]},
}


def resolve_sizes(name: str, sizes: dict | None = None) -> dict[str, object]:
    """Every size of task `name`: the given ones, the defaults for the rest, and the values the
    generator would derive for sizes left at None (so results record what actually ran)."""
    defaults = task_sizes(name)
    sizes = dict(sizes or {})
    unknown = sorted(set(sizes) - set(defaults))
    if unknown:
        raise ValueError(f"{name}: unknown size(s) {unknown}; expected some of {sorted(defaults)}")
    resolved = {**defaults, **sizes}
    derived = _DERIVED_SIZES.get(name, lambda s: {})(resolved)
    return {**resolved, **{k: v for k, v in derived.items() if resolved[k] is None}}
