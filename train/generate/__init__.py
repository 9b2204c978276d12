"""Text generation: the language model as prefill + cached one-token decode steps.

    lm.py        Decoder: prefill(params, tokens) and step(params, tokens_t, caches), pure
    mixers.py    prefill / step of each mixer (attention slot caches, GatedDeltaNet state)
    sampling.py  temperature, top-k, top-p, greedy
    driver.py    Generator: jitted prefill and step, caches resized to the live keys, timing
    loading.py   a run's config, tokenizer, model and checkpoint params

The command line is train/cli/generate.py (`python -m train generate RUN --prompt TEXT`).
"""
