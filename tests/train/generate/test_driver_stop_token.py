"""Generation stops once every row has produced the stop token: a row that stopped stays
stopped even when it later samples other tokens, generation runs until the last row stops,
and the CLI prints no row's tokens after its stop token.

A scripted decoder (greedy, one-hot logits of a fixed token table) says exactly when each row
emits the stop token; it has no attention layers, so no slot caches."""

import jax
import jax.numpy as jnp
import numpy as np

from train.cli.generate import _Streamer, _text
from train.generate.driver import Generator
from train.generate.sampling import SamplingConfig
from tests.seeds import case_seed

VOCAB, STOP = 8, 7


class ScriptedDecoder:
    """params: the tokens [B, N] to emit; new token n of row b is params[b, n]."""

    def prefill(self, params, tokens):
        logits = jax.nn.one_hot(params[:, 0], VOCAB) * 10.0
        return jnp.broadcast_to(logits[:, None], (tokens.shape[0], tokens.shape[1], VOCAB)), \
            ({"next": jnp.ones((), jnp.int32)},)

    def step(self, params, tokens_t, caches):
        index = caches[0]["next"]
        logits = jax.nn.one_hot(jnp.take(params, index, axis=1), VOCAB) * 10.0
        return logits, ({"next": index + 1},)


def script(seed, stop_steps, length):
    """Random non-stop tokens, STOP at stop_steps[b] of row b and random tokens (STOP
    included) after it."""
    rng = np.random.default_rng(seed)
    table = rng.integers(0, STOP, (len(stop_steps), length)).astype(np.int32)
    for row, step in enumerate(stop_steps):
        table[row, step] = STOP
        after = np.arange(step + 1, length)
        table[row, after] = rng.integers(0, STOP + 1, after.size)
        table[row, after[::3]] = rng.integers(0, STOP, after[::3].size)   # surely not STOP
    return table


def generate(table, max_new_tokens, stop_token=STOP):
    generator = Generator(ScriptedDecoder(), jnp.asarray(table),
                          SamplingConfig(temperature=0.0), VOCAB)
    emitted = []
    result = generator.generate(np.zeros((table.shape[0], 3), np.int32), max_new_tokens,
                                on_tokens=lambda tokens: emitted.append(np.asarray(tokens)),
                                stop_token=stop_token)
    return result, np.stack(emitted, axis=1)


def test_generation_runs_until_every_row_has_stopped():
    seed = case_seed(2911)
    stop_steps = [0, 2, 5]          # row 0 stops on its first (prefill) token, row 2 last
    table = script(seed, stop_steps, 12)
    table[0, 5] = table[1, 5] = 1   # at row 2's stop no other row repeats the stop token
    table[2, 6:] = 2                # and row 2 never again: no later step has all three
    result, streamed = generate(table, 12)
    assert result.tokens.shape == (3, 6), f"seed {seed}: {result.tokens}"
    np.testing.assert_array_equal(result.tokens, table[:, :6])
    np.testing.assert_array_equal(streamed, result.tokens)
    # without a stop token (or one never produced) it runs to max_new_tokens
    assert generate(table, 12, stop_token=None)[0].tokens.shape == (3, 12)
    assert generate(np.where(table == STOP, 0, table), 12)[0].tokens.shape == (3, 12)
    # all rows stopped at once: generation ends there
    together = script(seed, [3, 3, 3], 12)
    assert generate(together, 12)[0].tokens.shape == (3, 4)


def test_a_stopped_row_stays_stopped_and_prints_nothing_after_its_stop_token():
    seed = case_seed(2912)
    table = script(seed, [1, 4], 10)
    table[0, 2:] = [1, 2, 3, 4, 5, 6, 1, 2]           # row 0 keeps sampling after its stop
    result, _ = generate(table, 10)
    assert result.tokens.shape == (2, 5), f"seed {seed}: {result.tokens}"

    class Letters:
        def decode(self, ids):
            return "".join("abcdefgh"[i] for i in ids)

    assert _text(Letters(), result.tokens[0], STOP) == "abcdefgh"[table[0, 0]]
    assert _text(Letters(), result.tokens[1], STOP) == \
        "".join("abcdefgh"[i] for i in table[1, :4])
    streamer = _Streamer(Letters(), STOP)
    printed = []
    streamer._print = lambda text: printed.append(text)
    for column in result.tokens.T:
        streamer(column)
    assert streamer.ids == [int(table[0, 0])]        # row 0's tokens after STOP are not taken
