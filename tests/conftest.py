"""One fresh random seed per test session, shared by all xdist workers.

Tests draw inputs from `run_seed()` mixed with their own case number, so every run checks new
inputs. A failing run is reproduced with `TEST_SEED=<seed> ./dev.sh test`, the seed shown in
the header and, when a run fails, again at its end (`-q` drops the header).

One JAX persistent compilation cache per test session, also shared by all xdist workers and the
subprocesses tests start (they inherit the environment): a program that several tests compile
(the tiny trainer's step, say) is compiled by XLA once per session and loaded from the cache
after that. The cache is keyed by the program, the compile options, the devices and the
JAX/XLA versions, so what runs is the same executable; tracing and lowering still happen in
every test. The directory is fresh for each session (results never depend on an earlier run)
and is deleted at its end, unless TESTS_JAX_CACHE names a directory to keep it in across
sessions (the local loop: a program unchanged since the last run is loaded, not compiled;
the cache's keys make that the same executable, so results still do not depend on it).

XLA's CPU backend compiles at its lowest optimisation level (XLA_FLAGS
--xla_backend_optimization_level=0, also inherited by the subprocesses; tests/devices.py
keeps it when it adds the device count): it changes LLVM's code generation for the CPU only, not
what is computed, and cut the CPU time summed over the suite's tests from 1705 s to 1312 s
(same machine and load; the GPU the library targets never runs this code). The tests that
check the ring attention at XLA's default level ask for it (`run_on_cpu_devices(..., default_level=True)`); an XLA_FLAGS that already
names a level is left alone.

Under pytest-xdist (`-n 2`), tests marked `slow` are handed out first (one long test started
last would otherwise run on alone), and the tests of each module in SHARED_FIXTURE_MODULES go
to one worker, so their expensive module-scoped fixture is built once, not once per worker;
the modules of each group in SHARED_SESSION_FIXTURES go to one worker together, so the
session-scoped fixture they share is built once per session.
"""

import os
import shutil
import sys
import tempfile

import numpy as np

_CACHE_OWNER = "_TESTS_JAX_CACHE_OWNER_PID"
CPU_LEVEL_FLAG = "--xla_backend_optimization_level=0"

# modules whose module-scoped fixture trains a run or starts an 8-device subprocess
SHARED_FIXTURE_MODULES = frozenset({
    "tests/fpa_jax/test_context_parallel.py",
    "tests/mixer_core/test_shard.py",
    "tests/train/cli/test_entry_unreadable_runs.py",
    "tests/train/experiments/test_stages_chain.py",
})

# session-scoped fixtures that train a run: the modules using each go to one worker together
SHARED_SESSION_FIXTURES = {
    "gdn_cpt_runs": ("tests/train/cli/test_cpt.py", "tests/train/cli/test_spectra.py"),
    "tiny_trained_run": ("tests/train/cli/test_eval_long.py", "tests/train/cli/test_export.py",
                         "tests/train/cli/test_generate.py",
                         "tests/train/cli/test_generate_progress.py",
                         "tests/train/core/test_evaluate_documents.py",
                         "tests/train/experiments/test_long_eval.py"),
    "tiny_fpa_run": ("tests/train/generate/test_lm.py",
                     "tests/train/tools/test_export_fpa_torch.py"),
}
SCHEDULING_UNITS = {**{module: module for module in SHARED_FIXTURE_MODULES},
                    **{module: fixture for fixture, modules in SHARED_SESSION_FIXTURES.items()
                       for module in modules}}


class _XdistScheduling:
    """Registered only where pytest-xdist is (its hook is unknown to pytest otherwise)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") != "load":   # an explicit --dist keeps xdist's own
            return None
        from xdist.scheduler import LoadScopeScheduling

        class ModuleGroups(LoadScopeScheduling):
            """Load scheduling one test at a time, except that each module of
            SHARED_FIXTURE_MODULES and each group of SHARED_SESSION_FIXTURES is one unit
            (xdist's `xdist_group` marks would do this with --dist=loadgroup, but they do not
            reach its scheduler under pytest 9)."""

            def _split_scope(self, nodeid):
                return SCHEDULING_UNITS.get(nodeid.split("::", 1)[0], nodeid)

        return ModuleGroups(config, log)


def pytest_configure(config):
    os.environ.setdefault("TEST_SEED", str(np.random.SeedSequence().entropy % 2**31))
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistScheduling(), "tests-xdist-scheduling")
    if "PYTEST_XDIST_WORKER" in os.environ:
        return   # a worker: the controller made the cache and set the environment
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:   # read when JAX's backend starts
        os.environ["XLA_FLAGS"] = f"{flags} {CPU_LEVEL_FLAG}".strip()
    kept = os.environ.get("TESTS_JAX_CACHE")
    if kept:
        cache = os.path.abspath(kept)
        os.makedirs(cache, exist_ok=True)
    else:
        cache = tempfile.mkdtemp(prefix="jax_test_cache_")
        os.environ[_CACHE_OWNER] = str(os.getpid())     # deleted at the session's end
    os.environ.update({"JAX_COMPILATION_CACHE_DIR": cache,
                       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                       "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"})
    if "jax" in sys.modules:   # imported before this hook (a plugin): set it there too
        import jax
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_unconfigure(config):
    if os.environ.get(_CACHE_OWNER) == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """On xdist workers, `slow` tests first (the controller hands tests out in the workers'
    collection order); a plain run keeps the file order, so module fixtures are built once."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_report_header(config):
    return f"TEST_SEED={os.environ['TEST_SEED']} (fresh random inputs; set it to reproduce)"


def pytest_terminal_summary(terminalreporter, exitstatus):
    """The seed again at the end, where `-q` (which drops the header) still shows it."""
    if exitstatus != 0:
        terminalreporter.write_line(f"TEST_SEED={os.environ['TEST_SEED']} "
                                    "(rerun with it to reproduce the failures)")
