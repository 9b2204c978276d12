"""A scripted decoder for the generation driver (greedy, one-hot logits of a fixed token
table): it says exactly when each row emits the stop token. It has no attention layers, so no
slot caches. Shared by tests/train/generate/test_driver_stop_token.py and
tests/train/cli/test_generate_streamer.py."""

import jax
import jax.numpy as jnp
import numpy as np

from train.generate.driver import Generator
from train.generate.sampling import SamplingConfig

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
