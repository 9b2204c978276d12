"""`python -m train config CONFIG [key=value ...]`: the resolved config as YAML, and its
differences from the preset."""

from __future__ import annotations

import yaml

from train.cli.common import add_command_with_config, differences_line
from train.core.presets import load_config


def add_config_command(commands) -> None:
    add_command_with_config(commands, "config",
                            "print the resolved config (preset + overrides) as YAML", command_config)


def command_config(args) -> int:
    config = load_config(args.config, args.overrides)
    print(yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=False), end="")
    print("# " + differences_line(args.config, config))
    return 0
