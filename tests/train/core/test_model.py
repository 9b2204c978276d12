"""Model assembly: mixers per pattern, logical axes, causality and document isolation."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from train.core.model import (build_mixer, build_model, positions_within_documents,
                              resolve_vocab_size)
from train.core.presets import load_config

VOCAB = 257  # the byte tokenizer's


def tiny(*overrides):
    return load_config(None, ["model.d_model=32", "attention.num_heads=2", "attention.head_dim=16",
                              "gdn.num_heads=2", "gdn.head_dim=16", *overrides])


def abstract_params(config, length=16):
    model = build_model(config, VOCAB)
    tokens = jnp.zeros((1, length), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens,
                                             jnp.ones_like(tokens)))["params"]


def logical_names(boxed):
    return jax.tree.map(lambda x: x.names, boxed,
                        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def test_vocab_is_padded_to_the_multiple():
    assert resolve_vocab_size(tiny(), 257) == 320
    assert resolve_vocab_size(tiny("model.vocab_multiple=1"), 257) == 257
    assert resolve_vocab_size(tiny("model.vocab_size=1000"), 257) == 1024
    with pytest.raises(ValueError, match="smaller"):
        resolve_vocab_size(tiny("model.vocab_size=100"), 257)


@pytest.mark.parametrize("overrides,expected", [
    (["attention.kind=fpa"], "FPAAttention"),
    (["attention.kind=fox"], "FoXAttention"),
    (["attention.kind=softmax", "attention.position=alibi"], "SoftmaxAttention"),
    (["attention.kind=selective", "attention.position=nope"], "SelectiveAttention"),
    (["attention.kind=dcp"], "DCPAttention"),
    (["model.pattern=G"], "GatedDeltaNet"),
])
def test_each_mixer_kind_builds(overrides, expected):
    config = tiny(*overrides)
    assert type(build_mixer(config, 0, "mixer")).__name__ == expected
    params = abstract_params(config)
    assert set(params) == {"embed", "final_norm", "layers_0", "layers_1"}


def test_pattern_places_mixers_and_no_bias_layers():
    config = tiny("model.num_layers=4", "model.pattern=GA", "attention.no_bias_layers=[1]")
    params = abstract_params(config)
    mixers = [params[f"layers_{i}"]["mixer"] for i in range(4)]
    assert "a_proj" in mixers[0] and "a_proj" in mixers[2]
    assert "rho" not in mixers[1] and "delta_proj" not in mixers[1]  # FPA bias off in layer 1
    assert "rho" in mixers[3] and "delta_proj" in mixers[3]
    assert "query" in mixers[1] and "query" in mixers[3]


def test_params_carry_logical_axis_names():
    names = logical_names(abstract_params(tiny("model.tie_embeddings=false")))
    assert names["embed"]["embedding"] == ("vocab", "embed")
    assert names["lm_head"]["kernel"] == ("embed", "vocab")
    assert names["final_norm"]["scale"] == ("embed",)
    block = names["layers_0"]
    assert block["mlp"]["gate"]["kernel"] == ("embed", "mlp")
    assert block["mlp"]["down"]["kernel"] == ("mlp", "embed")
    assert block["mixer"]["query"]["kernel"] == ("embed", "heads", "head_dim")
    assert block["mixer"]["out"]["kernel"] == ("heads", "head_dim", "embed")
    assert "lm_head" not in abstract_params(tiny())  # tied by default


def test_mlp_width_default():
    params = abstract_params(tiny())
    assert params["layers_0"]["mlp"]["gate"]["kernel"].value.shape == (32, 96)
    params = abstract_params(tiny("model.mlp_dim=40"))
    assert params["layers_0"]["mlp"]["up"]["kernel"].value.shape == (32, 40)


def test_positions_restart_at_each_document():
    segments = jnp.array([[1, 1, 1, 2, 2, 3], [1, 2, 2, 2, 2, 2]])
    np.testing.assert_array_equal(positions_within_documents(segments),
                                  [[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 3, 4]])


@pytest.mark.parametrize("overrides", [["attention.kind=fpa"], ["attention.kind=fox"],
                                       ["attention.kind=softmax"], ["attention.kind=dcp"],
                                       ["attention.kind=selective", "attention.position=nope"],
                                       ["model.pattern=G"]])
def test_one_token_sequences_run(overrides):
    """T = 1 (a prompt of one token): positions and document starts keep their length."""
    model = build_model(tiny(*overrides), VOCAB)
    tokens = jnp.ones((2, 1), jnp.int32)
    # compiled whole (op by op, each small op of init and the forward compiled on its own)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens, tokens)
    assert jax.jit(model.apply)(params, tokens, tokens).shape[:2] == (2, 1)
    np.testing.assert_array_equal(positions_within_documents(tokens), [[0], [0]])


@pytest.mark.slow
def test_forward_is_causal_and_isolates_documents():
    """Hybrid GDN + FPA model: logits at t depend on tokens <= t of the same document only."""
    config = tiny("model.pattern=GA", "data.seq_len=24")
    model = build_model(config, VOCAB)
    length = 21  # not a multiple of any block size
    key_tokens, key_init, key_change = jax.random.split(jax.random.PRNGKey(7), 3)
    tokens = jax.random.randint(key_tokens, (2, length), 0, VOCAB)
    segments = jnp.array([[1] * 12 + [2] * 9, [1] * length])
    params = jax.jit(model.init)(key_init, tokens, segments)
    apply = jax.jit(model.apply)
    logits = apply(params, tokens, segments)
    assert logits.shape == (2, length, 320) and logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))

    # a change at position 15 (second document of row 0) leaves positions < 15 and the whole
    # first document unchanged, and changes later positions of the same document
    changed = tokens.at[:, 15].set((tokens[:, 15] + 1 + jax.random.randint(
        key_change, (2,), 0, VOCAB - 1)) % VOCAB)
    changed_logits = apply(params, changed, segments)
    np.testing.assert_allclose(changed_logits[:, :15], logits[:, :15], atol=1e-5, rtol=1e-5)
    assert float(jnp.max(jnp.abs(changed_logits[:, 15:] - logits[:, 15:]))) > 1e-4

    # a change in row 0's first document leaves its second document unchanged
    changed = tokens.at[0, 3].set((tokens[0, 3] + 5) % VOCAB)
    changed_logits = apply(params, changed, segments)
    np.testing.assert_allclose(changed_logits[0, 12:], logits[0, 12:], atol=1e-5, rtol=1e-5)
    assert float(jnp.max(jnp.abs(changed_logits[0, 3:12] - logits[0, 3:12]))) > 1e-4


def test_forward_rejects_bad_inputs():
    config = tiny("attention.kind=softmax", "attention.position=rope")
    model = build_model(config, VOCAB)
    tokens = jnp.zeros((2, 8), jnp.int32)
    with pytest.raises(ValueError, match="tokens and segment_ids"):
        model.init(jax.random.PRNGKey(0), tokens[0], jnp.ones(8, jnp.int32))
    with pytest.raises(ValueError, match="tokens and segment_ids"):
        model.init(jax.random.PRNGKey(0), tokens, jnp.ones((2, 7), jnp.int32))
    with pytest.raises(TypeError, match="integer"):
        model.init(jax.random.PRNGKey(0), tokens.astype(jnp.float32), jnp.ones_like(tokens))


@pytest.mark.slow
def test_scanned_layers_are_the_same_function():
    """model.scan_layers: the blocks as one lax.scan over the pattern's repeats give the loop's
    logits, auxiliary loss and gradients (the parameter tree is the loop's), here over two
    repeats of a (GDN, FoX) period with mixture-of-experts MLPs (the auxiliary loss summed over
    the scan) and remat."""
    overrides = ["model.num_layers=4", "model.pattern=GA", "attention.kind=fox",
                 "model.moe_experts=4", "model.remat=true"]
    from train.core.moe import apply_with_auxiliary_loss
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(0, VOCAB, (2, 8)), jnp.int32)
    segments = jnp.ones_like(tokens).at[1, 5:].set(2)
    results = []
    for scan in ("false", "true"):
        model = build_model(tiny(*overrides, f"model.scan_layers={scan}"), VOCAB)
        # the params alone: the forward that init runs (kept alive by the sown auxiliary
        # loss in init's full output) is dead code here, so it is not compiled a third time
        params = jax.jit(lambda key: model.init(key, tokens, segments)["params"])(
            jax.random.PRNGKey(0))

        def loss(params):
            logits, aux = apply_with_auxiliary_loss(model, params, tokens, segments)
            return jnp.mean(jax.nn.logsumexp(logits, -1)) + jnp.mean(aux), (logits, aux)

        (_, (logits, aux)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        text = str(jax.make_jaxpr(lambda p: model.apply({"params": p}, tokens, segments))(params))
        results.append((logits, aux, grads, text.count("dot_general")))
    (logits, aux, grads, products), (logits_s, aux_s, grads_s, products_s) = results
    assert products_s < products      # one period's program, not one per layer
    np.testing.assert_allclose(logits_s, logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(aux_s, aux, rtol=1e-5, atol=1e-7)
    assert float(jnp.max(jnp.abs(aux))) > 0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads_s, grads)
