"""verl_recipes.cli: every subcommand answers --help, on this machine's install."""

from __future__ import annotations

import pytest
from verl_recipes.cli import ALIASES, SUBCOMMANDS, main


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    assert "not built yet" not in capsys.readouterr().out


@pytest.mark.parametrize("old", sorted(ALIASES))
def test_an_old_name_runs_its_subcommand_and_says_the_new_name(old: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert ALIASES[old] in SUBCOMMANDS
    with pytest.raises(SystemExit) as e:
        main([old, "--help"])
    out = capsys.readouterr()
    assert e.value.code == 0 and f"verl-recipes {ALIASES[old]}" in out.out
    assert f"`verl-recipes {old}` is the old name of `verl-recipes {ALIASES[old]}`" in out.err
