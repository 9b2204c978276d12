"""The fpa-torch export format: the files, config.json and tensor table (no torch needed), and,
where torch and transformers are installed, `AutoModelForCausalLM.from_pretrained(dir,
trust_remote_code=True)` giving the JAX model's float32 logits (relative L2 <= 1e-5), padding
and greedy generate()."""

import ast
import json
import math
import os

import jax
import numpy as np
import pytest
from flax import traverse_util

from tests.seeds import case_seed
from train.tools import export
from train.cli.entry import build_parser, main
from train.cli.export import command_export
from train.core.presets import load_config
from train.tools.export_layout import expected_layout
from train.tools.safetensors_file import read_safetensors

VOCAB = 64
LENGTH = 37
# norm_eps well above the default and small embeddings: the epsilon moves the logits measurably
BASE = ["attention.kind=fpa", "model.d_model=32", "model.num_layers=2", "attention.num_heads=2",
        "attention.head_dim=16", "model.vocab_size=64", "model.vocab_multiple=1",
        "model.norm_eps=1e-4"]
VARIANTS = {
    "fpa": [],
    "query_level_bias_only": ["attention.query_level=true", "attention.content=false",
                              "attention.key_level=false", "attention.num_heads=3",
                              "attention.head_dim=8", "model.tie_embeddings=false"],
    "dip_sum_stack_form": ["attention.dip_sum=true", "attention.stack_form=true",
                           "attention.no_bias_layers=[0]"],
}
FILES = {"model.safetensors", "config.json", "README.md", "configuration_fpa.py",
         "modeling_fpa.py"}


def random_params(config, seed):
    """Params drawn at scales where every term of the forward matters: kernels N(0, 1/fan_in),
    embeddings N(0, 0.05^2) (so norm_eps counts), biases and rho N(0, 1), norm scales 1 + N(0,
    0.2^2). The scalar maps (delta, g, h) then vary by O(1) per token: dips and dead keys."""
    rng = np.random.default_rng(seed)
    flat = {}
    for path, leaf in traverse_util.flatten_dict(export.abstract_params(config, VOCAB)).items():
        noise = rng.standard_normal(leaf.shape).astype(np.float32)
        if path[-1] == "kernel":
            fan_in = math.prod(leaf.shape[:2]) if path[-2] == "out" else leaf.shape[0]
            noise = noise / np.float32(math.sqrt(fan_in))
        elif path[-1] == "embedding":
            noise = noise * np.float32(0.05)
        elif path[-1] == "scale":
            noise = 1 + noise * np.float32(0.2)
        flat[path] = noise
    return traverse_util.unflatten_dict(flat)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def exported(request, tmp_path_factory):
    """(config, params, export directory) of one tiny FPA variant in format fpa-torch. The
    directory's name carries the xdist worker: transformers copies remote code to a cache
    folder named after it, shared by all processes, without a lock."""
    config = load_config(None, BASE + VARIANTS[request.param])
    params = random_params(config, case_seed(7000 + sorted(VARIANTS).index(request.param)))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out = export.export_params(params, config, VOCAB,
                               tmp_path_factory.mktemp(f"{request.param}-{worker}-"),
                               format="fpa-torch")
    return config, params, out


def test_files_config_and_tensor_table(exported):
    config, _, out = exported
    assert {path.name for path in out.iterdir()} == FILES
    for name in export.FPA_TORCH_FILES:
        assert (out / name).read_bytes() == (export.HF_FPA_DIR / name).read_bytes()
    saved = json.loads((out / export.CONFIG_FILE).read_text())
    a, m = config.attention, config.model
    assert saved["auto_map"] == {"AutoConfig": "configuration_fpa.FPAConfig",
                                 "AutoModelForCausalLM": "modeling_fpa.FPAForCausalLM"}
    assert saved["model_type"] == "fpa_transformer"
    assert saved["architectures"] == ["FPAForCausalLM"]
    assert "layer_types" not in saved
    assert (saved["hidden_size"], saved["num_hidden_layers"], saved["intermediate_size"],
            saved["num_heads"], saved["head_dim"], saved["norm_eps"], saved["vocab_size"],
            saved["tie_word_embeddings"], saved["dtype"]) == (
        m.d_model, m.num_layers, config.mlp_dim(), a.num_heads, a.head_dim, m.norm_eps, VOCAB,
        m.tie_embeddings, "float32")
    assert saved["fpa"] == {"stack_form": a.stack_form, "key_level": a.key_level,
                            "query_level": a.query_level, "content": a.content,
                            "dip_sum": a.dip_sum, "tau": a.tau,
                            "no_bias_layers": list(a.no_bias_layers)}
    tensors, metadata = read_safetensors(out / export.WEIGHTS_FILE)
    assert {name: t.shape for name, t in tensors.items()} == expected_layout(config, VOCAB)
    assert metadata == {"format": "pt"}
    readme = (out / export.README_FILE).read_text()
    assert "trust_remote_code=True" in readme and str(out) in readme


def test_pytorch_files_import_only_torch_and_transformers():
    """Besides the standard library's math and the configuration file beside it."""
    for name in export.FPA_TORCH_FILES:
        tree = ast.parse((export.HF_FPA_DIR / name).read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add("." * node.level + (node.module or "").split(".")[0])
        assert imported <= {"math", "torch", "transformers", ".configuration_fpa"}, name


@pytest.mark.parametrize("overrides,message", [
    (["attention.kind=fox"], "^attention.kind='fox'"),
    (["model.pattern=GA"], "^model.pattern='GA'.*Gated DeltaNet"),
    (["model.moe_experts=2"], "^model.moe_experts=2"),
])
def test_models_the_pytorch_file_cannot_run_are_refused(overrides, message, tmp_path):
    config = load_config(None, BASE + overrides)
    with pytest.raises(export.ExportError, match=message):
        export.export_params(None, config, VOCAB, tmp_path, format="fpa-torch")
    assert not any(tmp_path.iterdir())


def test_unknown_format_is_refused_and_the_cli_takes_fpa_torch(tmp_path):
    config = load_config(None, BASE)
    with pytest.raises(export.ExportError, match="^format: .*'onnx'"):
        export.export_params(None, config, VOCAB, tmp_path, format="onnx")
    args = build_parser().parse_args(["export", str(tmp_path), "--format", "fpa-torch",
                                      "--out", str(tmp_path / "out")])
    assert (args.handler, args.format) == (command_export, "fpa-torch")


@pytest.mark.slow
def test_cli_exports_a_trained_fpa_run(tiny_fpa_run, tmp_path, capsys):
    """`python -m train export RUN --format fpa-torch` on a two-step tiny FPA run: the files
    of the format plus the run's token ids and tokenizer."""
    out = tmp_path / "out"
    assert main(["export", str(tiny_fpa_run), "--format", "fpa-torch", "--out", str(out)]) == 0
    assert "as fpa_transformer" in capsys.readouterr().out
    assert {path.name for path in out.iterdir()} == FILES | {"generation_config.json",
                                                             "tokenizer"}
    saved = json.loads((out / export.CONFIG_FILE).read_text())
    assert saved["auto_map"] == export.FPA_TORCH_AUTO_MAP and "eos_token_id" in saved


# ----------------------------------------------------------------------------------------------
# With torch and transformers (not dependencies of this project; the tests skip without them)
# ----------------------------------------------------------------------------------------------


def load_torch_model(out):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True,
                                                              dtype=torch.float32)
    return torch, model.eval()


def test_torch_logits_match_the_jax_model(exported):
    from train.core.model import LanguageModel

    config, params, out = exported
    torch, model = load_torch_model(out)
    tokens = np.random.default_rng(case_seed(7100)).integers(0, VOCAB, (2, LENGTH), np.int32)
    with jax.default_matmul_precision("highest"):
        expected = np.asarray(jax.jit(LanguageModel(config, VOCAB).apply)(
            {"params": params}, tokens, np.ones_like(tokens)))
    with torch.no_grad():
        logits = model(torch.as_tensor(tokens, dtype=torch.long)).logits
    assert logits.dtype == torch.float32 and tuple(logits.shape) == (2, LENGTH, VOCAB)
    error = np.linalg.norm(logits.numpy() - expected) / np.linalg.norm(expected)
    assert error <= 1e-5, f"relative L2 error {error:.3g}"


def test_torch_padding_and_greedy_generate(exported):
    """Left and right padding under attention_mask leave a row's logits as without padding;
    generate() (no KV cache) continues like argmax over repeated full forwards."""
    _, _, out = exported
    torch, model = load_torch_model(out)
    row = torch.as_tensor(np.random.default_rng(case_seed(7200)).integers(0, VOCAB, (1, 11)))
    pad = torch.zeros((1, 4), dtype=torch.long)
    with torch.no_grad():
        plain = model(row).logits
        left = model(torch.cat([pad, row], 1),
                     attention_mask=torch.cat([pad, torch.ones_like(row)], 1)).logits[:, 4:]
        right = model(torch.cat([row, pad], 1),
                      attention_mask=torch.cat([torch.ones_like(row), pad], 1)).logits[:, :11]
        torch.testing.assert_close(left, plain, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(right, plain, rtol=1e-5, atol=1e-5)
        generated = model.generate(row, attention_mask=torch.ones_like(row), max_new_tokens=3,
                                   do_sample=False, pad_token_id=0)
        expected = row
        for _ in range(3):
            step = model(expected).logits[:, -1].argmax(-1, keepdim=True)
            expected = torch.cat([expected, step], 1)
    assert torch.equal(generated, expected)
