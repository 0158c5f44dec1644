"""The README's first command on a machine that has only Python and pip: a clean virtual
environment, `pip install nox` as the README says it, then `nox -l` and a misspelt session name.

Only the listing runs (the sessions' own installs take many minutes); what it proves is that
nothing before a session's install needs more than nox (no PyYAML, no package of this project).
"""

from __future__ import annotations

import re
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_install() -> list[str]:
    """The pip install of the README's two commands (`python3 -m pip install PKG... && nox ...`)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    m = re.search(r"python3 -m pip install ([^&\n]+?) && nox ", block)
    assert m, "the README's first command is no longer `python3 -m pip install ... && nox ...`"
    return m.group(1).split()


@pytest.mark.slow
def test_readmes_commands_list_the_sessions_in_a_clean_venv(tmp_path: Path, pypi: None) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    clean = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    assert subprocess.run([py, "-c", "import yaml"], env=clean, capture_output=True).returncode != 0
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", *_readme_install()]
    subprocess.run(pip, env=clean, check=True, capture_output=True, timeout=300)
    nox = str(env_dir / "bin" / "nox")
    r = subprocess.run([nox, "-l"], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "recipe-7b-lora " in r.stdout and "* tests" in r.stdout
    r = subprocess.run([nox, "-s", "recipe-7b-lor"], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "did you mean 'recipe-7b-lora'? `nox -l` lists them" in r.stderr, r.stderr
