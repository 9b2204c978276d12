"""`python -m train eval` and `prepare`: their --help shows the defaults."""


from train.cli.entry import build_parser


def subcommand(name):
    return build_parser()._subparsers._group_actions[0].choices[name]


def help_of(parser):
    return " ".join(parser.format_help().split())


def test_eval_and_prepare_help_show_the_defaults():
    assert "per cell (default: 20)" in help_of(subcommand("eval"))
    text = help_of(subcommand("prepare"))
    assert "--num-shards" in text and "(default: 4)" in text
