"""Per-pair elementwise instructions of the attention kernels, read from their lowered MLIR
(no GPU needed).

    python benchmarks/kernel_op_count.py [--ops fpa,fox,softmax] [--dim 64] [--segments]
        [--detail] [--shuffles]

Lowers each op's forward and backward programs for Hopper (benchmarks/hlo_op_count.py
`programs`, bf16, `lowering_platforms=("cuda",)`, "lane" semantics: the Mosaic GPU module is
already one thread's code, every tile operation expanded into its registers' operations) and
counts, in each kernel's sweep loop, the elementwise operations one thread issues per tile:
float arithmetic, compares and selects, integer operations on tiles (a vector<2> operation
counts 2), the PTX the kernels write inline (ex2, rsqrt, rcp, min, max, abs; one each) and,
with --shuffles, the warp shuffles of sums over a tile's rows. It counts after MLIR's
canonicalisation and CSE have dropped dead and repeated operations; an add or subtract of a
product used only there counts as one fused multiply-add ("fma"), as ptxas contracts them, and
a conversion of two floats to a packed 16-bit pair as one. Divided by the 32 pairs a thread
holds of a 64 x 64 tile, that is the "per pair" figure Nsight Compute's source counters give on
the GPU (docs/benchmarks.md, "At the train step's shape": FoX's sweeps about 19 instructions
per pair, FPA's 43-48), less the integer and address work around it, which the count leaves
out.

A sweep's loop body branches (`lax.cond` / `lax.switch` lower to `scf.index_switch`): a tile
is skipped or computed, and an off-diagonal FPA tile takes one of four share paths (no dead
pair, query minimum, separable, row-referenced;
mixer_kernels/mosaic_gpu/attention/backward_kernels.py `_share_path`). Each row of the table
is one way through the loop body, its branches named by their position (`b1.0` = the second switch's first branch), with the operations counted
along that way. The table shows where the elementwise work of a tile is and how a change to
a kernel moves it, before any GPU time is spent; it does not time anything (register
pressure, latency and the matmuls are not in it).
"""

import argparse
import collections
import contextlib
import itertools
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from jax._src.lib.mlir import ir, passmanager  # noqa: E402
from jax._src.pallas.mosaic_gpu import lowering  # noqa: E402

from benchmarks import fpa_backward_options, hlo_op_count  # noqa: E402

PAIRS_PER_THREAD = 64 * 64 // 128   # one warpgroup holds a 64 x 64 float32 tile
FLOAT_OPS = frozenset({"arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.negf",
                       "arith.maximumf", "arith.minimumf", "arith.maxnumf", "arith.minnumf",
                       "arith.cmpf", "arith.select", "math.fma", "math.exp2", "math.exp",
                       "arith.truncf", "arith.extf"})
# integer operations on tiles (vector results): the diagonal tiles' level arithmetic; scalar
# integer operations (indices, addresses) are left out
TILE_INT_OPS = frozenset({"arith.addi", "arith.subi", "arith.muli", "arith.cmpi", "arith.xori",
                          "arith.andi", "arith.ori", "arith.shli", "arith.shrui", "arith.shrsi",
                          "math.ctlz"})
INLINE_PTX = ("ex2", "rsqrt", "min", "max", "abs", "lg2", "rcp", "fma")
SWITCHES = frozenset({"scf.index_switch", "scf.if"})


@contextlib.contextmanager
def captured_kernels():
    """Within the block, the Mosaic GPU lowering also keeps each kernel's module, canonicalised
    and with common subexpressions merged (operations whose results nothing uses are gone, as
    they will be from the compiled kernel): yields the list it fills with (kernel name,
    module); the lowering is restored on leaving."""
    kernels = []
    lower = lowering.lower_jaxpr_to_module

    def keep(*args, **kwargs):
        result = lower(*args, **kwargs)
        names = [str(op.operation.attributes["sym_name"]).strip('"')
                 for op in result.module.body.operations
                 if "sym_name" in op.operation.attributes]
        with result.module.context:
            module = ir.Module.parse(str(result.module))
            passmanager.PassManager.parse("builtin.module(canonicalize,cse)").run(
                module.operation)
        kernels.append((names[-1], module))   # the kernel's function comes last
        return result

    lowering.lower_jaxpr_to_module = keep
    try:
        yield kernels
    finally:
        lowering.lower_jaxpr_to_module = lower


def warpgroup_barriers(module) -> int:
    """The warpgroup barriers (`bar.sync`) in a lowered kernel module, every branch counted."""
    return str(module).count("bar.sync")


def shared_memory_bytes(module) -> int:
    """The dynamic shared memory a lowered kernel module launches each program with."""
    text = str(module)
    size = re.search(r"gpu.launch async[^\n]*dynamic_shared_memory_size (%\w+)", text).group(1)
    return int(re.search(re.escape(size) + r" = arith.constant (\d+)", text).group(1))


def weight(op, shuffles=False):
    """Counter {instruction: count} of one MLIR operation's elementwise instructions (empty
    for everything else; warp shuffles only with `shuffles`)."""
    name = op.name
    if name == "llvm.inline_asm":
        text = str(op.attributes["asm_string"]).strip('"').split()
        head = text[0].split(".")[0] if text else ""
        return collections.Counter({head: 1} if head in INLINE_PTX else {})
    kind = str(op.results[0].type) if len(op.results) else ""
    if name == "nvvm.shfl.sync":   # the cross-lane steps of a tile's sums along its columns
        return collections.Counter({"shfl": 1} if shuffles else {})
    if name in TILE_INT_OPS and kind.startswith("vector<"):
        lanes = int(kind[len("vector<"):].split("x")[0])
        return collections.Counter({name.split(".")[-1]: lanes})
    if name not in FLOAT_OPS:
        return collections.Counter()
    lanes = int(kind[len("vector<"):].split("x")[0]) if kind.startswith("vector<") else 1
    if name == "arith.truncf" and lanes > 1 and "16" in kind:
        lanes //= 2   # two floats to one packed 16-bit pair: one cvt.rn.bf16x2.f32
    if name in ("arith.addf", "arith.subf") and any(map(_fusable_product, op.operands)):
        # ptxas contracts a product used once into the add that takes it: one FFMA
        return collections.Counter({"fma": lanes, "mulf": -lanes})
    return collections.Counter({name.split(".")[-1]: lanes})


def _fusable_product(value):
    owner = value.owner if isinstance(value, ir.OpResult) else None
    return (owner is not None and owner.name == "arith.mulf"
            and sum(1 for _ in value.uses) == 1)


def ways(block_ops, shuffles=False):
    """[(label, Counter of instructions)] of every way through a sequence of operations: the
    operations outside switches count once, each switch adds one of its branches (a loop or
    scoped region inside counts its first way)."""
    own, choices = collections.Counter(), []
    for op in block_ops:
        op = op.operation
        own.update(weight(op, shuffles))
        if op.name in SWITCHES:
            options = []
            for branch, region in enumerate(op.regions):
                inner = [o for block in region.blocks for o in block.operations]
                options += [(f"b{len(choices)}.{branch}" + (f" {label}" if label else ""), count)
                            for label, count in ways(inner, shuffles)]
            choices.append(options)
        elif op.regions:   # a loop or a scoped region inside: everything in it counts
            for region in op.regions:
                inner = [o for block in region.blocks for o in block.operations]
                for label, count in ways(inner, shuffles)[:1]:
                    own.update(count)
    result = []
    for combination in itertools.product(*choices) if choices else [()]:
        label = " ".join(label for label, _ in combination)
        total = collections.Counter(own)
        for _, count in combination:
            total.update(count)
        result.append((label, total))
    return result


def sweep_loops(op):
    """The outermost scf.for loops of a kernel (its sweeps over tiles)."""
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                if child.operation.name == "scf.for":
                    yield child.operation
                else:
                    yield from sweep_loops(child.operation)


def tile_counts(kernels, op_name, dim=64, segments=False, shuffles=False):
    """[(kernel, way, Counter of instructions per tile)] of the op's kernels, one row per
    distinct count; `kernels` is the list captured_kernels() yields."""
    del kernels[:]
    for fn, abstract in hlo_op_count.programs(op_name, (1, 256, 1, dim), segments).values():
        jax.jit(fn).trace(*abstract).lower(lowering_platforms=("cuda",))
    rows = []
    for kernel, module in kernels:
        loops = list(sweep_loops(module.operation))
        if not loops:   # one tile per program (the diagonal shares): the whole kernel
            rows.append((kernel, "whole kernel",
                         ways(list(module.body.operations), shuffles)[0][1]))
            continue
        body = [o for block in loops[-1].regions[0].blocks for o in block.operations]
        distinct = {}
        for label, count in ways(body, shuffles):
            distinct.setdefault(count.total(), (kernel, label or "(no branch)", count))
        rows += distinct.values()
    return rows


def print_table(kernels, args):
    print("| op | kernel | way through the loop body | instructions / tile | per pair |")
    print("|---|---|---|---|---|")
    for op_name in args.ops.split(","):
        for kernel, label, count in tile_counts(kernels, op_name, args.dim, args.segments,
                                                args.shuffles):
            total = count.total()
            detail = ""
            if args.detail:
                detail = " (" + ", ".join(f"{name} {n / PAIRS_PER_THREAD:.1f}"
                                          for name, n in count.most_common()) + ")"
            print(f"| {op_name} | {kernel.removesuffix('_mosaic_gpu')} | {label} | {total} "
                  f"| {total / PAIRS_PER_THREAD:.1f}{detail} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="fpa,fox,softmax")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--segments", action="store_true", help="with document ids")
    parser.add_argument("--detail", action="store_true", help="instructions by kind, per pair")
    fpa_backward_options.add(parser)
    parser.add_argument("--shuffles", action="store_true",
                        help="also count the warp shuffles of the sums over a tile's rows")
    args = parser.parse_args()
    fpa_backward_options.apply(args)
    with captured_kernels() as kernels:
        print_table(kernels, args)


if __name__ == "__main__":
    main()
