"""What `python -m train generate` (train/cli/generate.py) prints when rows stop: a row that
produced the stop token stays stopped even when it later samples other tokens, and neither
`_text` nor the streaming `_Streamer` shows a row's tokens after its stop token. The scripted
decoder (tests/train/generate/scripted_decoder.py) says exactly when each row emits it."""

from tests.seeds import case_seed
from tests.train.generate.scripted_decoder import STOP, generate, script
from train.cli.generate import _Streamer, _text


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
