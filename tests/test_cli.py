"""``kronos-mlflow``: every subcommand answers ``--help`` (exit 0), and so does training's flag
list (every config key's help text, some with a '%' that argparse would try to format)."""

from __future__ import annotations

import pytest

from kronos_mlflow.cli.main import SUBCOMMANDS, main


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_answers_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kronos-mlflow {name}")


def test_training_help_shows_every_key(capsys):
    from kronos_mlflow.config.core import DEFAULTS

    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(f"--{key.replace('_', '-')}" in out for key in DEFAULTS)
    assert "(0.005 = 0.5%)" in out  # a '%' in a help text, shown as written
