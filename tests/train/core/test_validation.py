"""Checks of a Config before anything starts (train/core/validation.py): the mesh sizes for a
device count, and train.check_ranges refused on more than one device; each layer's
implementation checked against its op's registry at load (a registered one loads, an unused
mixer section is not checked); values no run can use named by their key (model.moe_top_k above
the expert count, an unknown cpt.positions)."""

import pytest

from tests.train.core.test_sharding_context_parallel import BASE
from tests.train.experiments.test_cpt import HYBRID
from train.core.config import ConfigError
from train.core.presets import load_config
from train.core.validation import validate_for_devices


def test_mesh_sizes_against_device_count():
    config = load_config("tiny_fpa", ["mesh.fsdp=4", "mesh.tensor=2", "data.batch_size=16"])
    assert validate_for_devices(config, 8) == (1, 4, 2)
    assert validate_for_devices(config, 16) == (2, 4, 2)
    with pytest.raises(ConfigError, match="does not divide"):
        validate_for_devices(config, 4)
    with pytest.raises(ConfigError, match="batch_size"):
        validate_for_devices(load_config("tiny_fpa", ["data.batch_size=12"]), 8)
    with pytest.raises(ConfigError, match="devices"):
        validate_for_devices(load_config("tiny_fpa", ["mesh.data=2"]), 8)


def test_checked_ranges_are_refused_on_more_than_one_device():
    # the checkify-wrapped step cannot trace the mixers' shard_map (any mesh of > 1 device)
    with pytest.raises(ConfigError, match="train.check_ranges"):
        validate_for_devices(load_config(None, BASE + ["train.check_ranges=true"]), 4)
    with pytest.raises(ConfigError, match="train.check_ranges"):
        validate_for_devices(load_config(None, BASE[:2] + ["train.check_ranges=true"]), 2)
    assert validate_for_devices(load_config(None, BASE[:2] + ["train.check_ranges=true"]),
                                1) == (1, 1, 1)


@pytest.mark.parametrize("overrides,message", [
    (["attention.kind=selective", "attention.implementation=xla"],
     "attention.implementation='xla' with attention.kind='selective'.*selective_attention"),
    (["attention.kind=dcp", "attention.implementation=xla"], "dcp_attention"),
    (["attention.implementation=cuda"], "fpa_attention"),
    (["model.pattern=G", "gdn.implementation=fast"], "gdn.implementation='fast'.*gated_delta_rule"),
])
def test_implementation_is_checked_against_the_op_registry_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_config("tiny_fpa", overrides)
    assert "\n" not in str(error.value)


def test_registered_implementations_load():
    assert load_config("tiny_softmax", ["attention.implementation=cudnn"]).attention.implementation == "cudnn"
    assert load_config("tiny_gdn", ["gdn.implementation=reference"]).gdn.implementation == "reference"
    # a preset's unused mixer section is not checked (tiny_fpa has no GDN layer)
    assert load_config("tiny_fpa", ["gdn.implementation=fast"]).gdn.implementation == "fast"


def test_config_rejects_top_k_above_expert_count():
    with pytest.raises(ConfigError, match="moe_top_k"):
        load_config("hybrid_moe_tiny", ["model.moe_top_k=5"])


def test_unknown_position_method_is_a_config_error():
    with pytest.raises(ConfigError, match="cpt.positions"):
        load_config("tiny_hybrid", HYBRID + ["cpt.positions=ntk"])
