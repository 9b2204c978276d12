"""benchmarks/verify_export_fla.py (the fla export check): its arguments and its table from saved
logits (everywhere), and, where flash-linear-attention, einops, torch and transformers are
installed, fla's own model classes loading this project's exports and giving the JAX model's
float32 logits on the CPU (fla's Triton kernels replaced by PyTorch stand-ins, fla's own
reference functions where it has one: the verify script's `--torch-device cpu`)."""

import argparse
import json

import jax
import numpy as np
import pytest
from flax import traverse_util

from benchmarks import verify_export_fla as verify
from tests.seeds import case_seed
from train.core.presets import load_config
from train.tools import export

VOCAB = 48
BASE = ["model.d_model=32", "model.num_layers=2", "attention.num_heads=2", "attention.head_dim=16",
        "gdn.num_heads=2", "gdn.head_dim=16", "model.vocab_size=48", "model.vocab_multiple=1",
        "model.norm_eps=1e-4"]
FAMILIES = {
    "fox": ["attention.kind=fox"],
    "softmax": ["attention.kind=softmax", "attention.position=rope", "attention.rope_base=500",
                "model.tie_embeddings=false"],
    "gdn": ["model.pattern=G", "gdn.num_v_heads=4", "gdn.conv_size=3"],
    "gdn_softmax_hybrid": ["model.pattern=GA", "attention.kind=softmax",
                           "attention.position=rope", "gdn.num_v_heads=4", "gdn.v_head_dim=8"],
}


def test_sizes_and_models_arguments():
    assert verify.parse_sizes("2x256x2,12x4096") == [(2, 256, 2), (12, 4096, 1)]
    assert verify.size_name((12, 4096, 1)) == "L12_T4096_B1"
    for bad in ("2x", "2x256x2x1", "0x5", "ax3", "2x256,"):
        with pytest.raises(argparse.ArgumentTypeError, match="LAYERSxLENGTH"):
            verify.parse_sizes(bad)
    assert verify.parse_models("gdn, fox") == ["gdn", "fox"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown \\['fpa'\\]"):
        verify.parse_models("fox,fpa")


def test_table_reads_the_saved_logits(tmp_path):
    """Each column is the relative L2 error of the named pair; a family without fla logits is
    NOT RUN with the reason, a float32 error above 1e-5 fails, bf16 within 2x the refs passes."""
    size = (2, 16, 1)
    rng = np.random.default_rng(case_seed(1))
    base = rng.standard_normal((1, 16, 8)).astype(np.float32)
    folder = tmp_path / "fox" / verify.size_name(size)
    folder.mkdir(parents=True)

    def save(label, relative):
        noise = rng.standard_normal(base.shape)
        noise *= relative * np.linalg.norm(base) / np.linalg.norm(noise)
        np.save(folder / f"{label}.npy", (base + noise).astype(np.float32))
        return base + noise

    np.save(folder / "jax_fp32.npy", base)
    fla_fp32 = save("fla_fp32", 3e-6)
    save("jax_bf16", 1e-2)
    np.save(folder / "fla_bf16.npy", (fla_fp32 + 0.012 * np.linalg.norm(base) / np.sqrt(base.size)
                                      * rng.standard_normal(base.shape)).astype(np.float32))
    (tmp_path / "fox" / "torch_ieee.json").write_text(json.dumps(
        {"sizes": {verify.size_name(size): {"class": "ForgettingTransformerForCausalLM",
                                            "weights_loaded_exactly": True}}}))
    (tmp_path / "gdn").mkdir()
    (tmp_path / "gdn" / "jax_export.json").write_text(json.dumps(
        {"error": "RuntimeError: boom", "sizes": {}}))
    table, results, all_pass = verify.build_table(tmp_path, ["fox", "gdn"], [size], {})
    errors = results["fox"]["sizes"]["L2_T16_B1"]["errors"]
    assert errors["fp32"] == pytest.approx(3e-6, rel=0.05)
    assert errors["ref_jax_bf16"] == pytest.approx(1e-2, rel=0.05)
    fox_row, gdn_row = table.splitlines()[2:]
    assert "ForgettingTransformerForCausalLM" in fox_row and "fp32 ok, bf16 ok" in fox_row
    assert "NOT RUN" in gdn_row and "RuntimeError: boom" in gdn_row
    assert not all_pass
    save("fla_fp32", 3e-5)
    table, _, _ = verify.build_table(tmp_path, ["fox"], [size], {})
    assert "FP32 FAIL" in table


def test_fp32_verdict_tells_rounding_from_a_mismatch():
    """Above 1e-5 passes only when JAX's own float32 logits are about as far from float64 as
    the two sides are from each other, and fla no further than 3x JAX."""
    assert verify.fp32_verdict({"fp32": 8e-6}) == ("fp32 ok", True)
    text, passed = verify.fp32_verdict({"fp32": 2e-5, "fla_vs_f64": 1.4e-5, "jax_vs_f64": 1.3e-5})
    assert passed and text.startswith("fp32 ok at float32 rounding")
    for errors in ({"fp32": 2e-5}, {"fp32": 2e-5, "fla_vs_f64": 2e-5, "jax_vs_f64": 2e-6},
                   {"fp32": 2e-5, "fla_vs_f64": 6e-5, "jax_vs_f64": 1.5e-5}):
        assert verify.fp32_verdict(errors) == ("FP32 FAIL", False)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_float64_oracle_gives_the_jax_logits(family, tmp_path):
    """The script's float64 forward in fla's conventions (f64_logits) against the JAX model."""
    tokens, expected = export_random_model(family, 200, tmp_path)
    assert verify.relative_l2(verify.f64_logits(tmp_path, tokens), expected) <= 1e-5


def export_random_model(family, case, tmp_path):
    """A model of `family` with random parameters exported to tmp_path: 2 x 70 random tokens and
    the JAX model's logits for them (float32 matmuls at full precision)."""
    from train.core.model import LanguageModel

    config = load_config(None, BASE + FAMILIES[family] + ["gdn.implementation=reference"])
    rng = np.random.default_rng(case_seed(case + sorted(FAMILIES).index(family)))
    params = random_params(config, rng)
    export.export_params(params, config, VOCAB, tmp_path)
    tokens = rng.integers(0, VOCAB, (2, 70)).astype(np.int32)
    with jax.default_matmul_precision("highest"):
        expected = np.asarray(jax.jit(LanguageModel(config, VOCAB).apply)(
            {"params": params}, tokens, np.ones_like(tokens)))
    return tokens, expected


def random_params(config, rng):
    flat = traverse_util.flatten_dict(export.abstract_params(config, VOCAB))
    return traverse_util.unflatten_dict({path: random_leaf(rng, path, leaf.shape)
                                         for path, leaf in flat.items()})


def random_leaf(rng, path, shape):
    """Kernels N(0, 1/fan_in), embeddings N(0, 0.05^2) (norm_eps then counts), norm scales
    1 + N(0, 0.2^2), per-head vectors (biases, A_log, dt_bias) N(0, 1)."""
    noise = rng.standard_normal(shape)
    if path[-1] == "kernel":
        noise /= np.sqrt(np.prod(shape[:2]) if path[-2] == "out" else shape[0])
    elif path[-1] == "embedding":
        noise *= 0.05
    elif path[-1] == "scale":
        noise = 1 + 0.2 * noise
    return noise.astype(np.float32)


@pytest.fixture(scope="module")
def fla_on_cpu():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("einops")
    verify.install_flash_attn_stand_in()       # before fla's attention layer imports it
    pytest.importorskip("fla")                 # (also registers fla's configs with transformers)

    verify.install_cpu_reference_ops()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fla_model_classes_give_the_jax_logits(family, fla_on_cpu, tmp_path):
    """norm_eps 1e-4 and small embeddings, so that an epsilon convention shows; 70 tokens, past
    one 64-token chunk; every parameter drawn away from its initial value."""
    import torch
    from safetensors.numpy import load_file

    tokens, expected = export_random_model(family, 100, tmp_path)
    model = fla_on_cpu.from_pretrained(tmp_path, dtype=torch.float32).eval()
    state = model.state_dict()
    for name, tensor in load_file(str(tmp_path / export.WEIGHTS_FILE)).items():
        np.testing.assert_array_equal(state[name].numpy(), tensor, err_msg=name)
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(tokens).long(), use_cache=False).logits
    assert verify.relative_l2(logits.numpy(), expected) <= 1e-5
