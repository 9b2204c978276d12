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
from collections import Counter
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


def variable_dips_layout(levels: int, num_values: int) -> dict[str, int]:
    """Id offsets of `variable_dips` (r levels, V names): PAD 0, HELD 1, FELL 2, DOWN 3, UP 4,
    KEY(v) = 5 + v (v < V), ASK(v, j) = 5 + V + v r + j - 1 (j = 1..r); vocab_size = 5 + V + V r."""
    key = 5
    ask = key + num_values
    return {"held": 1, "fell": 2, "down": 3, "up": 4, "key": key, "ask": ask,
            "vocab_size": ask + num_values * levels}


def dip_steps(rng: np.random.Generator, depth: int, wiggles: int, fixed: bool) -> list[int]:
    """The steps of one dip from the surface back to it, +1 one level down (DOWN), -1 one level
    up (UP), whose deepest point is exactly `depth` levels below the surface: DOWN^depth
    UP^depth with `wiggles` pairs inserted. fixed: every pair is (UP DOWN) at the bottom, so the
    dip is DOWN^depth (UP DOWN)^wiggles UP^depth. Else each pair goes, in turn, at a uniformly
    random place among the valid (place, kind) choices: (UP DOWN) where the dip is at least one
    level down, (DOWN UP) where it is above its deepest point; so the dip never leaves the
    levels between the surface and its deepest point, and its time at each level varies."""
    if fixed:
        return [1] * depth + [-1, 1] * wiggles + [-1] * depth
    steps = [1] * depth + [-1] * depth
    for _ in range(wiggles):
        below = np.concatenate([[0], np.cumsum(steps)])     # levels below the surface
        choices = [(i, kind) for i, x in enumerate(below) for kind in (-1, 1)
                   if (kind == -1 and x >= 1) or (kind == 1 and x < depth)]
        i, kind = choices[int(rng.integers(len(choices)))]
        steps[i:i] = [kind, -kind]
    return steps


def _variable_dips_row(rng, levels, num_keys, num_values, max_wiggles, fixed_duration,
                       early_dip):
    layout = variable_dips_layout(levels, num_values)
    names = rng.choice(num_values, size=num_keys, replace=False)

    def dip():
        depth = int(rng.integers(1, levels + 1))
        wiggles = max_wiggles if fixed_duration else int(rng.integers(0, max_wiggles + 1))
        steps = dip_steps(rng, depth, wiggles, bool(fixed_duration))
        return depth, [layout["down"] if step == 1 else layout["up"] for step in steps]

    tokens = dip()[1] if early_dip else []
    depth, dip_tokens = dip()
    slot = int(rng.integers(1, num_keys + 1))          # keys before the dip: names[:slot]
    tokens += [layout["key"] + int(v) for v in names[:slot]]
    tokens += dip_tokens
    tokens += [layout["key"] + int(v) for v in names[slot:]]
    targets, mask = [PAD] * len(tokens), [False] * len(tokens)
    bottom = levels - depth                             # the dip's deepest level
    for index in rng.permutation(num_keys):
        lowest = bottom if index < slot else levels     # lowest level since the key
        threshold = bottom + 1 if bottom == 0 or rng.random() < 0.5 else bottom
        tokens.append(layout["ask"] + int(names[index]) * levels + threshold - 1)
        targets.append(layout["fell"] if lowest < threshold else layout["held"])
        mask.append(True)
    return tokens, targets, mask


def variable_dips(seed: int, num_sequences: int, levels: int = 6, num_keys: int = 4,
                  num_values: int | None = None, max_wiggles: int = 8,
                  fixed_duration: int = 0, early_dip: int = 1) -> ProbeData:
    """Variable-duration dips: how deep did the level fall after a key, however long it took?

    The level starts at the surface r = `levels`. Write phase: num_keys tokens KEY(v) (names v
    distinct, uniform from num_values symbols; None: num_values = num_keys) with one dip at a
    uniformly random place after the first key (at least one key is written before it). The dip
    is DOWN and UP tokens (the level falls / rises by one) from the surface back to it, whose
    deepest level is exactly r - D, D uniform in 1..r (`dip_steps`): DOWN^D UP^D with w pairs
    (UP DOWN) or (DOWN UP) inserted at random places between the surface and the bottom, w
    uniform in 0..max_wiggles. fixed_duration=1 is the control: w = max_wiggles, all at the
    bottom, so every dip of depth D is the same DOWN^D (UP DOWN)^w UP^D. early_dip=1: the
    sequence opens with a second dip, drawn the same way, before any key is written, so it
    bears on no answer (the tokens of the whole sequence say little about the dip after the
    keys; only the tokens after a key do). Then one query
    ASK(v, j) per key, in random order, scored: has the level been below j (1 <= j <= r) since
    KEY(v) was written? Target FELL if the lowest level after the key, m (r - D for a key
    before the dip, r after it), is below j, else HELD. Every threshold sits at the dip's
    bottom: j = r - D + 1 or j = r - D with probability 1/2 each (j = 1 when D = r), for keys
    before and after the dip alike. So an answer needs the depth D exactly and whether the
    dip came after the key; D is in no token. Layout: variable_dips_layout(levels,
    num_values); docs/experiments.md.
    """
    num_values = num_keys if num_values is None else num_values
    _check_sizes("variable_dips", num_sequences=num_sequences, levels=levels,
                 num_keys=num_keys, num_values=num_values)
    if num_values < num_keys:
        raise ValueError(f"variable_dips: num_values must be >= num_keys ({num_keys}), "
                         f"got {num_values}")
    if max_wiggles < 0 or fixed_duration not in (0, 1) or early_dip not in (0, 1):
        raise ValueError(f"variable_dips: need max_wiggles >= 0 and fixed_duration, early_dip "
                         f"0 or 1, got {max_wiggles}, {fixed_duration}, {early_dip}")
    rng = np.random.default_rng(seed)
    rows = [_variable_dips_row(rng, levels, num_keys, num_values, max_wiggles, fixed_duration,
                               early_dip) for _ in range(num_sequences)]
    return _pack(rows, variable_dips_layout(levels, num_values)["vocab_size"])


# ----------------------------------------------------------------------------------------------
# Live names
# ----------------------------------------------------------------------------------------------


def live_names_layout(levels: int, num_values: int) -> dict[str, int]:
    """Id offsets of `live_names` (r levels, V names): PAD 0, DEAD 1, ALIVE 2,
    KEY(v, l) = 3 + (l - 1) V + v (level l in 1..r, name v < V), DIP(d) = 3 + r V + d
    (d = 0..r-1), ASK(v) = 3 + r V + r + v; vocab_size = 3 + r V + r + V."""
    key = 3
    dip = key + levels * num_values
    ask = dip + levels
    return {"dead": 1, "alive": 2, "key": key, "dip": dip, "ask": ask,
            "vocab_size": ask + num_values}


def live_names(seed: int, num_sequences: int, levels: int = 12, num_keys: int = 8,
               num_values: int | None = 12, num_dips: int = 3, copies: int = 1) -> ProbeData:
    """Live names: which names occur among the keys that are still alive?

    Write phase: num_keys tokens KEY(v, l) (num_keys / copies distinct names v, uniform from
    num_values symbols, each written `copies` times; None: num_values = num_keys; levels l
    uniform in 1..r, r = `levels`, one per key) and num_dips tokens DIP(d) (d uniform in
    0..r-1), in uniformly random order. DIP(d) kills for good every key written before it
    whose level is above d. Then one query ASK(v) per name, in random order, scored: target
    ALIVE if the key named v is alive (no later dip falls below its level), else DEAD; with
    copies > 1, ALIVE if every key named v is alive. The write order is random, so a key's
    level is stated in its own token only (the position says nothing about it), and a query
    names the key by content only; with more names than a head's values can hold as a set,
    the name must be matched by content. Layout: live_names_layout(levels, num_values);
    docs/experiments.md.
    """
    num_values = num_keys if num_values is None else num_values
    _check_sizes("live_names", num_sequences=num_sequences, levels=levels, num_keys=num_keys,
                 num_values=num_values, num_dips=num_dips, copies=copies)
    if num_keys % copies:
        raise ValueError(f"live_names: num_keys ({num_keys}) must be a multiple of copies "
                         f"({copies})")
    if num_values < num_keys // copies:
        raise ValueError(f"live_names: num_values must be >= num_keys / copies "
                         f"({num_keys // copies}), got {num_values}")
    layout = live_names_layout(levels, num_values)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_sequences):
        names = rng.choice(num_values, size=num_keys // copies, replace=False)
        key_levels = rng.integers(1, levels + 1, size=num_keys)
        key_names = names if copies == 1 else rng.permutation(np.repeat(names, copies))
        events = np.array([True] * num_keys + [False] * num_dips)   # True: a key
        rng.shuffle(events)
        tokens, alive, key_index = [], [], 0    # alive: (name, level) of the live keys
        for is_key in events:
            if is_key:
                name, level = int(key_names[key_index]), int(key_levels[key_index])
                tokens.append(layout["key"] + (level - 1) * num_values + name)
                alive.append((name, level))
                key_index += 1
            else:
                depth = int(rng.integers(0, levels))
                tokens.append(layout["dip"] + depth)
                alive = [(name, level) for name, level in alive if level <= depth]
        targets, mask = [PAD] * len(tokens), [False] * len(tokens)
        live = Counter(name for name, _ in alive)
        for index in rng.permutation(len(names)):
            tokens.append(layout["ask"] + int(names[index]))
            targets.append(layout["alive"] if live[int(names[index])] == copies
                           else layout["dead"])
            mask.append(True)
        rows.append((tokens, targets, mask))
    return _pack(rows, layout["vocab_size"])


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
    "live_names": Task(live_names, 0.95, {"steps": 4000}),
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
    "variable_dips": lambda s: {"num_values": s["num_keys"]},
    "live_names": lambda s: {"num_values": s["num_keys"]},
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
