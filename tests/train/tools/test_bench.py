"""`bench`: model FLOPs per token (the formula on hand-computed configs), achieved TFLOP/s,
the matmul ceiling, MFU, and the --profile trace, on CPU at a tiny size."""

import json
from pathlib import Path

import pytest

from train.cli.entry import main
from train.core.presets import load_config
from train.tools.bench import matmul_ceiling_tflops, model_flops_per_token

TINY = ["model.d_model=16", "model.num_layers=2", "model.pattern=GA", "attention.kind=softmax",
        "attention.position=rope", "attention.num_heads=2", "attention.head_dim=8",
        "gdn.num_heads=2", "gdn.head_dim=8", "gdn.implementation=reference",
        "data.seq_len=16", "data.batch_size=2"]


def test_flops_per_token_on_hand_computed_configs():
    # 1 attention layer (H=2, D=16) at T=32, tied embeddings, 1000 params:
    #   dense 6 * 1000; attention 3 * 2 * (16 + 16) * 33 = 6336
    config = load_config(None, ["model.pattern=A", "model.num_layers=1", "attention.num_heads=2",
                                "attention.head_dim=16", "data.seq_len=32"])
    flops = model_flops_per_token(config, 1000, 64)
    assert flops == {"dense": 6000.0, "attention": 6336.0, "recurrence": 0.0, "total": 12336.0}

    # FPA without content: no q.k term -> 3 * 2 * 16 * 33 = 3168
    no_content = load_config(None, ["model.pattern=A", "model.num_layers=1", "attention.kind=fpa",
                                    "attention.content=false", "attention.num_heads=2",
                                    "attention.head_dim=16", "data.seq_len=32"])
    assert model_flops_per_token(no_content, 1000, 64)["attention"] == 3168.0

    # "GA" x 2 layers, untied (vocab 64 x d_model 32 = 2048 lookup params left out), GDN with
    # 2 q/k heads, 4 value heads, K = 16, V = 8, chunk 64:
    #   dense 6 * (10000 - 2048) = 47712
    #   attention 2 layers * 3 * 2 * (16 + 16) * 33 = 12672
    #   recurrence 2 layers * 3 * 4 * (6 * 16 * 8 + (2 * 16 + 8) * 65) = 2 * 12 * 3368 = 80832
    hybrid = load_config(None, [
        "model.pattern=GA", "model.num_layers=4", "model.d_model=32",
        "model.tie_embeddings=false", "attention.num_heads=2", "attention.head_dim=16",
        "gdn.num_heads=2", "gdn.num_v_heads=4", "gdn.head_dim=16", "gdn.v_head_dim=8",
        "data.seq_len=32"])
    flops = model_flops_per_token(hybrid, 10000, 64)
    assert flops["dense"] == 47712.0
    assert flops["attention"] == 12672.0
    assert flops["recurrence"] == 80832.0
    assert flops["total"] == 47712.0 + 12672.0 + 80832.0

    # MoE, 2 layers, 8 experts of width 24, top 2, tied, 100000 params: the 6 experts a token
    # skips in each layer, 2 * 6 * 3 * 16 * 24 = 13824 params, do no work
    moe = load_config(None, ["model.pattern=A", "model.num_layers=2", "model.d_model=16",
                             "model.moe_experts=8", "model.moe_top_k=2", "model.moe_expert_dim=24",
                             "attention.num_heads=2", "attention.head_dim=8", "data.seq_len=32"])
    assert model_flops_per_token(moe, 100000, 64)["dense"] == 6.0 * (100000 - 13824)


def test_matmul_ceiling_is_a_positive_rate():
    assert 0 < matmul_ceiling_tflops(64, repeats=2) < 1e4


@pytest.mark.slow
def test_bench_prints_mfu_and_writes_a_profile(tmp_path, capsys):
    out, profile = tmp_path / "bench.json", tmp_path / "trace"
    assert main(["bench", "tiny_softmax", *TINY, "--steps", "2", "--warmup", "1",
                 "--out", str(out), "--profile", str(profile)]) == 0
    printed = capsys.readouterr().out
    for row in ("model FLOPs / token", "achieved", "bf16 matmul ceiling", "MFU", "profile",
                "top op", "compile", "init"):
        assert row in printed
    result = json.loads(out.read_text())
    assert result["init_seconds"] > 0 and result["compile_seconds"] > 0
    windows = result["window_seconds"]      # two timed windows, the faster one counted
    assert len(windows) == 2 and min(windows) > 0
    assert result["seconds_per_step"] == pytest.approx(min(windows) / result["steps"])
    assert result["tokens_per_second"] == pytest.approx(
        result["batch_size"] * result["seq_len"] * result["steps"] / min(windows))
    assert result["model_flops_per_token"] == result["flops_terms"]["total"] > 6 * result["params"]
    assert result["flops_terms"]["attention"] > 0 and result["flops_terms"]["recurrence"] > 0
    assert result["achieved_tflops"] == pytest.approx(
        result["model_flops_per_token"] * result["tokens_per_second"] / 1e12)
    assert result["mfu"] == pytest.approx(
        result["achieved_tflops_per_device"] / result["matmul_ceiling_tflops"])
    assert 0 < result["mfu"] < 10
    traces = list(Path(profile).rglob("*.xplane.pb"))
    assert traces and traces[0].stat().st_size > 0
    shares = [share for _, share in result["top_ops"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1



def test_profile_into_a_file_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("")
    assert main(["bench", "tiny_softmax", *TINY, "--profile", str(path)]) == 1
    assert capsys.readouterr().err == f"error: --profile: {path} is a file, expected a directory\n"
