"""verl_recipes.cli: every subcommand answers --help, on this machine's install."""

from __future__ import annotations

import pytest
from verl_recipes.cli import SUBCOMMANDS, main


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    assert "not built yet" not in capsys.readouterr().out


def test_an_old_name_is_no_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    """`validate` was `check-bounds`'s old name; it is gone, and says so in argparse's one line."""
    with pytest.raises(SystemExit) as e:
        main(["validate", "7b-lora"])
    assert e.value.code == 2 and "invalid choice: 'validate'" in capsys.readouterr().err
