"""The dispatch Registry: ordered default with fall-through, explicit requests, explicit-only."""

import pytest

from mixer_core.registry import Entry, Registry, UnsupportedImplementationError


def _registry():
    return Registry("toy_op", default_order=("fast", "portable"), entries=(
        Entry("dense", lambda: "dense"),
        Entry("portable", lambda: "portable"),
        Entry("fast", lambda: "fast",
              supports=lambda **facts: None if facts["dim"] == 64 else "needs dim 64")))


def test_default_takes_the_first_entry_that_supports_the_inputs():
    registry = _registry()
    assert registry.select(None, dim=64)[0] == "fast"
    assert registry.select(None, dim=32)[0] == "portable"


def test_entries_outside_the_default_order_run_only_when_named():
    registry = _registry()
    name, fn = registry.select("dense", dim=32)
    assert (name, fn()) == ("dense", "dense")


def test_explicit_request_that_cannot_run_says_why():
    with pytest.raises(UnsupportedImplementationError, match="cannot run 'fast' here: needs dim 64"):
        _registry().select("fast", dim=32)


def test_unknown_name_names_the_argument_and_the_choices():
    registry = _registry()
    with pytest.raises(ValueError, match=r"implementation: toy_op has no implementation 'gpu'"):
        registry.select("gpu", dim=64)
    registry.check_name(None)
    with pytest.raises(ValueError, match="expected None or one of"):
        registry.check_name("gpu")


def test_explicit_only_entry_is_skipped_by_the_default_but_runs_when_named():
    registry = Registry("toy_op", default_order=("kernel", "portable"), entries=(
        Entry("kernel", lambda: "kernel", explicit_only="not validated on hardware"),
        Entry("portable", lambda: "portable")))
    assert registry.select(None)[0] == "portable"
    assert registry.select("kernel")[0] == "kernel"


def test_no_default_that_fits_lists_every_reason():
    registry = Registry("toy_op", default_order=("fast",), entries=(
        Entry("fast", lambda: None, supports=lambda **facts: "needs a GPU"),))
    with pytest.raises(UnsupportedImplementationError, match="fast: needs a GPU"):
        registry.select(None)


def test_a_name_is_listed_once():
    with pytest.raises(ValueError, match="'fast' is listed twice"):
        Registry("toy_op", default_order=("fast",),
                 entries=(Entry("fast", lambda: None), Entry("fast", lambda: None)))


def test_the_table_is_read_only_and_a_reordered_copy_keeps_the_entries():
    registry = _registry()
    with pytest.raises(TypeError):
        registry._entries["gpu"] = Entry("gpu", lambda: None)
    with pytest.raises(AttributeError):
        registry.default_order = ("portable",)
    portable_first = registry.with_default_order(("portable", "fast"))
    assert portable_first.select(None, dim=64)[0] == "portable"
    assert portable_first.names() == registry.names() and registry.select(None, dim=64)[0] == "fast"
