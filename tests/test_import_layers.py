"""Which way the imports go (docs/architecture.md, "The training package"), and where the tests
of a module are.

Every module of the library packages and of `train` is parsed with `ast` (nothing is imported)
and mapped to a layer. A module may import from its own layer and from the layers below it,
never from a layer above; imports inside functions count like the others. Within `train` the
modules import each other without cycles. A kernel family (mixer_kernels/<backend>/<family>/)
imports itself, its backend's top-level modules and mixer_core only.

tests/ mirrors the package tree, and every test file is named after the module it tests:
tests/<dir>/test_<name>.py, where <name> is the name of a module of <dir>/ or begins with it
and "_" (test_<module>_<aspect>.py when one module has several test files); a package's tests of
itself as a whole are tests/<package>/test_<package>.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("mixer_core", "mixer_kernels", "fpa_jax", "gdn_jax", "train")     # the modules checked
ABOVE = ("benchmarks", "tests")         # may import the packages, never imported by them

# bottom to top; a module belongs to the layer of the longest prefix that names it
LAYERS = (
    # the ground floor: registry, ranges, padding, interpreter switch, mesh axes and shard_map
    ("library core", ("mixer_core",)),
    # the kernels, by backend: the core and their own backend only, nothing from the ops
    ("kernels", ("mixer_kernels",)),
    ("library ops", ("fpa_jax", "gdn_jax", "fpa_jax.decode.slots")),
    # the Flax layers, their decoding and what builds on a layer (the GDN diagnostics), and
    # the packages' __init__ that re-export them (PACKAGE_INITS)
    ("library layers", ("fpa_jax.layers", "fpa_jax.decode", "gdn_jax.layer",
                        "gdn_jax.diagnostics")),
    ("train.data", ("train", "train.data")),       # "train": its __init__ imports nothing
    ("train.checkpoint", ("train.checkpoint",)),
    ("train.core", ("train.core",)),
    ("train.experiments, train.tools", ("train.experiments", "train.tools", "train.probes",
                                        "train.generate", "train.hf_fpa")),
    ("train.cli", ("train.cli", "train.__main__")),
    ("benchmarks, tests", ABOVE),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PACKAGE_INITS = {"fpa_jax": "library layers", "gdn_jax": "library layers"}


def layer_of(module: str) -> int:
    """Index into LAYERS of the longest matching prefix (a package's __init__ by
    PACKAGE_INITS)."""
    if module in PACKAGE_INITS:
        return [name for name, _ in LAYERS].index(PACKAGE_INITS[module])
    best, best_length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module}: in no layer of LAYERS")
    return best


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


MODULES = modules()


def imported_modules(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of a module of PACKAGES or ABOVE in the file, at any
    depth; for `from package import name` the submodule when `name` is one, else the package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")
                parent = parent if is_package else parent[:-1]
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((node.lineno, submodule if submodule in MODULES else base))
    return [(line, name) for line, name in found if name.split(".")[0] in PACKAGES + ABOVE]


def upward_imports_of(module: str, path: Path) -> list[str]:
    """One line per import of `module` (read from `path`) from a layer above its own."""
    own, problems = layer_of(module), []
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    for line, target in imported_modules(module, path):
        if layer_of(target) > own:
            problems.append(f"{where}:{line}: {module} imports {target} (layer "
                            f"{LAYERS[layer_of(target)][0]}) from layer {LAYERS[own][0]}")
    return problems


def test_every_module_imports_only_from_its_layer_and_below():
    problems = [problem for module, path in MODULES.items()
                for problem in upward_imports_of(module, path)]
    assert not problems, "imports from a higher layer:\n" + "\n".join(problems)


def test_a_kernel_backend_imports_only_the_core_and_itself():
    """mixer_kernels/<backend>/ imports mixer_core and its own backend, no other backend."""
    problems = []
    for module, path in MODULES.items():
        parts = module.split(".")
        if parts[0] != "mixer_kernels" or len(parts) < 2:
            continue
        backend = ".".join(parts[:2])
        for line, target in imported_modules(module, path):
            if target.split(".")[0] != "mixer_core" and target.split(".")[:2] != parts[:2]:
                problems.append(f"{path.relative_to(REPO)}:{line}: {module} imports {target} "
                                f"(outside mixer_core and {backend})")
    assert not problems, "\n".join(problems)


def kernel_family(module: str) -> str | None:
    """The kernel family package mixer_kernels.<backend>.<family> that `module` lies in (is or
    is under), or None for the backends' top-level modules and what lies outside
    mixer_kernels."""
    parts = module.split(".")
    if parts[0] != "mixer_kernels" or len(parts) < 3 or not REPO.joinpath(*parts[:3]).is_dir():
        return None
    return ".".join(parts[:3])


def cross_family_imports_of(module: str, path: Path) -> list[str]:
    """One line per import of `module` (read from `path`), a module of a kernel family, from
    outside its family, its backend's top-level modules and mixer_core."""
    family = kernel_family(module)
    if family is None:
        return []
    backend = family.split(".")[:2]
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    problems = []
    for line, target in imported_modules(module, path):
        if target.split(".")[0] == "mixer_core" or kernel_family(target) == family:
            continue
        if target.split(".")[:2] == backend and kernel_family(target) is None:
            continue                            # the backend's top-level modules (common.py)
        problems.append(f"{where}:{line}: {module} imports {target} (outside mixer_core, "
                        f"{family} and {'.'.join(backend)}'s top-level modules)")
    return problems


def test_a_kernel_family_imports_only_itself_its_backends_top_level_and_the_core():
    """mixer_kernels/<backend>/<family>/ imports its own family, the modules directly in
    mixer_kernels/<backend>/ (the helpers every family shares) and mixer_core: what two
    families share lives in the backend's top level, never in one of them."""
    problems = [problem for module, path in MODULES.items()
                for problem in cross_family_imports_of(module, path)]
    assert not problems, "\n".join(problems)


def test_a_cross_family_import_is_named_with_its_file_and_line(tmp_path):
    path = tmp_path / "common.py"
    path.write_text("import jax\n\nfrom mixer_core.padding import pad_time\n"
                    "from mixer_kernels.mosaic_gpu.common import matmul\n"
                    "from mixer_kernels.mosaic_gpu.short_conv.forward import conv_forward_pass\n"
                    "from mixer_kernels.mosaic_gpu.attention.forward import heads_major\n")
    assert cross_family_imports_of("mixer_kernels.mosaic_gpu.short_conv.common", path) == [
        f"{path}:6: mixer_kernels.mosaic_gpu.short_conv.common imports "
        "mixer_kernels.mosaic_gpu.attention.forward (outside mixer_core, "
        "mixer_kernels.mosaic_gpu.short_conv and mixer_kernels.mosaic_gpu's top-level modules)"]
    attention = "mixer_kernels.mosaic_gpu.attention"
    assert kernel_family(attention) == kernel_family(attention + ".forward") == attention
    assert kernel_family("mixer_kernels.mosaic_gpu.common") is None
    assert kernel_family("mixer_kernels.mosaic_gpu") is None


def test_the_op_families_do_not_import_each_other():
    """fpa_jax and gdn_jax share only what lies below them (mixer_core, the kernels): a hybrid
    model combines them in train/, never one inside the other."""
    families = ("fpa_jax", "gdn_jax")
    problems = []
    for module, path in MODULES.items():
        family = module.split(".")[0]
        if family not in families:
            continue
        for line, target in imported_modules(module, path):
            other = target.split(".")[0]
            if other in families and other != family:
                problems.append(f"{path.relative_to(REPO)}:{line}: {module} imports {target}")
    assert not problems, "\n".join(problems)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and modules that
    import themselves."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_training_package_has_no_import_cycles():
    graph = {module: {target for _, target in imported_modules(module, path)
                      if target.split(".")[0] == "train" and target != module}
             for module, path in MODULES.items() if module.split(".")[0] == "train"}
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_an_upward_import_is_named_with_its_file_and_line(tmp_path):
    path = tmp_path / "config.py"
    path.write_text("import json\n\nfrom train.data.tokenizer import ByteTokenizer\n\n\n"
                    "def late():\n    from train.cli import UserError\n")
    assert upward_imports_of("train.core.config", path) == [
        f"{path}:7: train.core.config imports train.cli (layer train.cli) from layer train.core"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module, layer", [
    ("fpa_jax.fpa.api", "library ops"), ("fpa_jax.context_shard", "library ops"),
    ("fpa_jax.layers.fpa", "library layers"), ("gdn_jax.layer", "library layers"),
    ("fpa_jax.decode.slots", "library ops"), ("fpa_jax", "library layers"),
    ("mixer_core.shard", "library core"), ("mixer_core.registry", "library core"),
    ("mixer_kernels.mosaic_gpu.common", "kernels"), ("mixer_kernels.mosaic_gpu.attention.vjp", "kernels"),
    ("mixer_kernels.mosaic_gpu.gated_delta.vjp", "kernels"),
    ("mixer_kernels.mosaic_gpu.short_conv.backward", "kernels"),
    ("train.data.tokenizer", "train.data"),
    ("train.checkpoint.manager", "train.checkpoint"), ("train.core.fit", "train.core"),
    ("train.experiments.cpt", "train.experiments, train.tools"),
    ("train.probes.cli", "train.experiments, train.tools"), ("train.cli.fit", "train.cli"),
])
def test_layers_of_some_modules(module, layer):
    assert module in MODULES
    assert LAYERS[layer_of(module)][0] == layer


# ---------------------------------------------------------------------- the tests' layout

# test files that test no one module, each with the reason
TEST_FILES_OF_NO_MODULE = {
    "tests/test_import_layers.py": "the imports of every package (and this layout)",
    "tests/benchmarks/test_gpu_scripts.py": "the shell scripts benchmarks/gpu/*.sh",
}


def misnamed_test_file(test: str) -> str | None:
    """Why tests/<dir>/test_<name>.py (a path relative to the repository) is named after no
    module of <dir>/, or None."""
    path = Path(test)
    directory = REPO.joinpath(*path.parent.parts[1:])
    name = path.stem.removeprefix("test_")
    modules = {file.stem for file in directory.glob("*.py") if file.stem != "__init__"}
    if any(name == module or name.startswith(module + "_") for module in modules):
        return None
    if name == directory.name and (directory / "__init__.py").exists():
        return None                             # the package as a whole: its own name only
    where = directory.relative_to(REPO).as_posix() + "/" if directory != REPO else "the root"
    return (f"{test}: no module of {where} is named {name!r} or a prefix of it "
            f"(modules: {', '.join(sorted(modules)) or 'none'})")


def test_every_test_file_is_named_after_a_module_of_its_mirrored_package():
    tests = sorted(path.relative_to(REPO).as_posix()
                   for path in (REPO / "tests").rglob("test_*.py"))
    problems = [problem for test in tests if test not in TEST_FILES_OF_NO_MODULE
                for problem in [misnamed_test_file(test)] if problem]
    assert not problems, "\n".join(problems)
    assert set(TEST_FILES_OF_NO_MODULE) <= set(tests), "stale TEST_FILES_OF_NO_MODULE entries"


@pytest.mark.parametrize("test, named", [
    ("tests/mixer_kernels/mosaic_gpu/attention/test_fields.py", True),
    ("tests/gdn_jax/ops/test_ops.py", True),              # the package as a whole
    ("tests/mixer_kernels/mosaic_gpu/attention/test_attention_fields.py", False),
    ("tests/train/core/test_evaluation.py", False),       # "evaluate" is no prefix of it
    ("tests/fpa_jax/test_fpa.py", False),                 # fpa_jax/fpa/ is a package: fpa/
    ("tests/no_such_package/test_thing.py", False),
])
def test_misnamed_test_files_are_found(test, named):
    assert (misnamed_test_file(test) is None) == named
