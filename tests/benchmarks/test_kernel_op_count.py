"""benchmarks/kernel_op_count.py: what it counts per MLIR operation, and that it finds one way
through the FPA sweeps per share path of a computed tile (no dead pair, query minimum,
separable, row-referenced), each above the plain softmax tile; and, read from the lowered kernels, that the compiled shares take their reciprocal as one
rcp.approx per pair."""

import pytest

from benchmarks import kernel_op_count as counter
from jax._src.lib.mlir import ir


def _weights(text):
    """counter.weight of each operation of a module body written in MLIR's generic form."""
    with ir.Context() as context:
        context.allow_unregistered_dialects = True
        module = ir.Module.parse(text)
        return [counter.weight(op.operation) for op in module.body.operations]


def test_weight_counts_lanes_and_inline_ptx():
    weights = _weights("""
      %a = "test.source"() : () -> vector<2xf32>
      %b = "test.source"() : () -> f32
      %i = "test.source"() : () -> i32
      %0 = "arith.mulf"(%a, %a) : (vector<2xf32>, vector<2xf32>) -> vector<2xf32>
      %1 = "arith.addf"(%b, %b) : (f32, f32) -> f32
      %2 = "arith.addi"(%i, %i) : (i32, i32) -> i32
      %3 = "llvm.inline_asm"(%b) {asm_string = "ex2.approx.ftz.f32 $0, $1;"} : (f32) -> f32
      %4 = "llvm.inline_asm"(%i) {asm_string = "bar.sync $0, 128;"} : (i32) -> i32
    """)
    assert weights[3:] == [{"mulf": 2}, {"addf": 1}, {}, {"ex2": 1}, {}]


@pytest.fixture(scope="module")
def kernels():
    with counter.captured_kernels() as captured:
        yield captured


def test_the_lowering_is_restored_after_capturing():
    lower = counter.lowering.lower_jaxpr_to_module
    with counter.captured_kernels():
        assert counter.lowering.lower_jaxpr_to_module is not lower
    assert counter.lowering.lower_jaxpr_to_module is lower


def test_fpa_share_paths_order_as_their_work(kernels):
    softmax = {kernel: count.total() for kernel, _, count in counter.tile_counts(kernels,
                                                                                 "softmax")}
    rows = counter.tile_counts(kernels, "fpa")
    for sweep in ("dkv", "dq"):
        totals = sorted({count.total() for kernel, label, count in rows
                         if kernel == f"attention_{sweep}_fpa_mosaic_gpu" and "b1.1" in label})
        # paths 0, 3, 1, 2 of a computed tile (no dead pair, query minimum, separable,
        # row-referenced)
        assert len(totals) == 4, totals
        assert softmax[f"attention_{sweep}_none_mosaic_gpu"] < totals[0]
        shares = [count for kernel, label, count in rows
                  if kernel == f"attention_{sweep}_fpa_mosaic_gpu" and count.total() > totals[0]]
        # compiled, the soft-min shares take one rcp.approx per pair (common.reciprocal)
        assert all(c["rcp"] == counter.PAIRS_PER_THREAD and not c["rsqrt"] for c in shares)
    diagonal = [count for kernel, label, count in rows if label == "whole kernel"]
    assert len(diagonal) == 1 and diagonal[0]["ex2"] > 0
