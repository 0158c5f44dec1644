"""`wheelhouse --with GROUP --local-wheels DIR`: extra wheels the lock lacks (recipe 70b-3d's Megatron set).

A tiny real platform wheel (`tinyext`, tagged cpXY-cpXY-linux_<arch> by `pip wheel` on this
machine) stands in for the self-built transformer_engine_torch; a tiny PyPI wheel (iniconfig) for
the group's PyPI wheels. Only the end-to-end test needs PyPI (about 20 KB); the others run offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.tags import platform_tags
from verl_recipes import RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.stack.lock import Target
from verl_recipes.stack.pins import load_pins
from verl_recipes.stack.wheelhouse.groups import (
    GroupPin,
    check_separate_calls,
    load_groups,
    pick_local_wheel,
    wheel_files,
)
from verl_recipes.stack.wheelhouse.pack import pack, render_install_sh

ROOT = repo_root()
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
CP = f"cp{sys.version_info.major}{sys.version_info.minor}"
MANYLINUX = next((t for t in platform_tags() if t.startswith("manylinux_")), None)
needs_glibc = pytest.mark.skipif(MANYLINUX is None, reason="needs a glibc Linux (a manylinux platform tag)")

# The main set of the end-to-end test: six from the committed lock's entry (hashes of both files).
LOCK = """\
six==1.17.0 \\
    --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274 \\
    --hash=sha256:ff70335d468e7eb6ec65b95b99d3a2836546063f63acc5171de367e834932a81
    # via -r requirements.in
"""
GROUP = """\
[tiny]
iniconfig = "2.3.0"
tinyext = { version = "0.1", local_build = "tests/test_wheelhouse_groups.py tinyext_wheel" }
"""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fake_wheel(dest: Path, name: str, version: str, tag: str, wheel_tag: str | None = None) -> Path:
    """A minimal wheel file named with `tag` (its WHEEL file says `wheel_tag`, default the same)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {wheel_tag or tag}\n".encode(),
    }
    record = "".join(f"{p},sha256={_sha(d)},{len(d)}\n" for p, d in files.items()) + f"{dist}/RECORD,,\n"
    path = dest / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in {**files, f"{dist}/RECORD": record.encode()}.items():
            z.writestr(p, d)
    return path


@pytest.fixture(scope="module")
def tinyext_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real platform wheel built by `pip wheel` with this interpreter: cpXY-cpXY-linux_<arch>."""
    src = tmp_path_factory.mktemp("tinyext-src")
    (src / "tinyext").mkdir()
    (src / "tinyext" / "__init__.py").write_text("import sys\nANSWER = 7\nBUILT_WITH = sys.version_info[:2]\n")
    (src / "setup.py").write_text(
        "from setuptools import setup\n"
        "from setuptools.dist import Distribution\n\n\n"
        "class Binary(Distribution):  # a platform wheel, as a compiled extension would give\n"
        "    def has_ext_modules(self):\n"
        "        return True\n\n\n"
        "setup(name='tinyext', version='0.1', packages=['tinyext'], distclass=Binary)\n"
    )
    out = tmp_path_factory.mktemp("tinyext-wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (wheel,) = out.glob("*.whl")
    assert wheel.name.startswith(f"tinyext-0.1-{CP}-{CP}-linux_"), wheel.name
    return wheel


def _cli(*args: str | Path, cache: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "verl_recipes.cli", "wheelhouse", *map(str, args)]
    env = {**os.environ, "VERL_RECIPES_CACHE": str(cache), "VERL_RECIPES_ROOT": str(ROOT)}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "lock.txt").write_text(LOCK)
    (tmp_path / "freeze.txt").write_text("pip==23.2.1\n")
    (tmp_path / "versions.toml").write_text(GROUP)
    return {"lock": tmp_path / "lock.txt", "have": tmp_path / "freeze.txt", "versions": tmp_path / "versions.toml"}


def _args(inputs: dict[str, Path], out: Path, python: str = PY, platform: str | None = None) -> list[str | Path]:
    return [
        "--python", python, "--platform", platform or MANYLINUX or "manylinux_2_28_x86_64",
        "--have", inputs["have"], "--lock", inputs["lock"], "--versions", inputs["versions"],
        "--only", "six", "--with", "tiny", "--out", out, "--no-xz", "--chunk-mib", "0.01",
    ]  # fmt: skip


# --------------------------------------------------------------------------- versions.toml groups


def test_megatron_group_pins_the_three_te_packages_together() -> None:
    """images/versions.toml [megatron]: the set of gpu/megatron-notes.md, TE all at one version."""
    groups = {q.name: q for q in load_groups(ROOT / "images" / "versions.toml", ["megatron"])}
    core = {
        "megatron-core": "0.19.2",
        "megatron-bridge": "0.6.2",
        "transformer-engine": "2.20.2",
        "transformer-engine-cu13": "2.20.2",
        "transformer-engine-torch": "2.20.2",
        "megatron-energon": "7.4.1",
    }
    assert {n: groups[n].version for n in core} == core
    assert [n for n, q in groups.items() if q.local_build] == ["transformer-engine-torch"]
    # the group adds only what the lock lacks: a package in both would be installed twice, at two
    # versions, the group's (merged in last, --no-deps) silently winning
    lock = (ROOT / "images" / "lock" / "gpu-py312.txt").read_text().splitlines()
    locked = {ln.split("==")[0].lower() for ln in lock if "==" in ln and not ln.startswith(" ")}
    assert not set(groups) & locked
    assert "megatron" not in load_pins(ROOT / "images" / "versions.toml")["gpu"]


def test_with_refuses_core_tables_and_malformed_entries(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"--with gpu: not a group table .*groups there: megatron"):
        load_groups(ROOT / "images" / "versions.toml", ["gpu"])
    bad = tmp_path / "v.toml"
    bad.write_text('[g]\nx = { version = "1" }\n')
    with pytest.raises(RecipeError, match="local_build"):
        load_groups(bad, ["g"])


# --------------------------------------------------------------------------- the tag check


@pytest.mark.parametrize(
    ("tag", "wrong"),
    [
        ("cp312-cp312-linux_x86_64", None),  # a local build, not audited: fine from --local-wheels
        ("cp312-cp312-manylinux_2_28_x86_64", None),
        ("py3-none-any", None),
        ("cp311-cp311-linux_x86_64", "it is built for cp311-cp311"),
        ("cp312-cp312-linux_aarch64", "it is built for linux_aarch64"),
        ("cp312-cp312-manylinux_2_40_x86_64", "it is built for manylinux_2_40_x86_64"),  # glibc newer than 2.39
    ],
)
def test_local_wheel_must_fit_the_target(tmp_path: Path, tag: str, wrong: str | None) -> None:
    target = Target("3.12", "manylinux_2_39_x86_64")
    gp = GroupPin("g", "tinyext", "0.1", "built by hand")
    wheel = fake_wheel(tmp_path, "tinyext", "0.1", tag)
    if wrong is None:
        assert pick_local_wheel(gp, [wheel], target) == wheel
        return
    with pytest.raises(RecipeError) as e:
        pick_local_wheel(gp, [wheel], target)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"--local-wheels {wheel.name}: {wrong}, the target is Python 3.12")
    assert "pass instead a tinyext-0.1-cp312-cp312-linux_x86_64.whl (or manylinux_2_N_x86_64 with N <= 39)" in msg


def test_local_wheel_renamed_or_missing_is_refused(tmp_path: Path) -> None:
    target = Target("3.12", "manylinux_2_39_x86_64")
    gp = GroupPin("g", "tinyext", "0.1", "built by hand")
    renamed = fake_wheel(tmp_path, "tinyext", "0.1", "cp312-cp312-linux_x86_64", wheel_tag="cp311-cp311-linux_x86_64")
    with pytest.raises(RecipeError, match=r"WHEEL file says cp311-cp311-linux_x86_64 \(renamed\?\)"):
        pick_local_wheel(gp, [renamed], target)
    older = fake_wheel(tmp_path, "tinyext", "0.0.9", "cp312-cp312-linux_x86_64")
    with pytest.raises(RecipeError, match=r"tinyext==0\.1 .*--local-wheels has only 0\.0\.9.*pip wheel --no-deps"):
        pick_local_wheel(gp, [older], target)


def test_group_and_rest_may_not_share_a_file(tmp_path: Path) -> None:
    """Two pip calls merged into one target: the second would overwrite the first's file."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = fake_wheel(tmp_path / "a", "pkg", "1.0", "py3-none-any")
    two = fake_wheel(tmp_path / "b", "pkg", "1.0", "py3-none-any")
    assert wheel_files(one) == {"pkg/__init__.py"}
    check_separate_calls({"the rest": [one], "--with g": [fake_wheel(tmp_path / "b", "other", "1", "py3-none-any")]})
    with pytest.raises(RecipeError, match=r"both install pkg/__init__.py, but in separate pip calls"):
        check_separate_calls({"the rest": [one], "--with g": [two]})


def test_install_sh_installs_each_group_in_its_own_call_after_the_rest() -> None:
    script = render_install_sh(
        [{"file": "wheelhouse.tar.part-000", "sha256": "0" * 64}],
        [{"file": "a.whl", "sha256": "1" * 64}, {"file": "tiny/b.whl", "sha256": "2" * 64, "group": "tiny"}],
    )
    assert "EXTRA_GROUPS=(tiny)" in script and "  wheels/tiny/b.whl" in script
    body = script[script.index("sha256sum --quiet -c") :]
    assert body.index('"${main[@]}"') < body.index('"${wheels[@]}"')  # hashes, then the rest, then groups


# --------------------------------------------------------------------------- the CLI, end to end


@needs_glibc
def test_missing_local_wheel_fails_before_any_download(tmp_path: Path, inputs: dict[str, Path]) -> None:
    cache, out = tmp_path / "cache", tmp_path / "house"
    r = _cli(*_args(inputs, out), cache=cache)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "tinyext==0.1" in r.stderr and "--local-wheels gives no such wheel" in r.stderr
    assert f"`python{PY} -m pip wheel --no-deps --no-build-isolation -w DIR tinyext==0.1` in a Python {PY}" in r.stderr
    assert not cache.exists() and not out.exists()  # nothing downloaded, nothing written


@needs_glibc
def test_local_wheel_for_another_python_is_refused(
    tmp_path: Path, inputs: dict[str, Path], tinyext_wheel: Path
) -> None:
    other = "3.12" if PY != "3.12" else "3.11"
    cache, out = tmp_path / "cache", tmp_path / "house"
    r = _cli(*_args(inputs, out, python=other), "--local-wheels", tinyext_wheel.parent, cache=cache)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    nodot = other.replace(".", "")
    assert f"--local-wheels {tinyext_wheel.name}: it is built for {CP}-{CP}" in r.stderr
    assert f"pass instead a tinyext-0.1-cp{nodot}-cp{nodot}-linux_" in r.stderr
    assert not cache.exists() and not out.exists()


@needs_glibc
def test_group_with_a_local_platform_wheel_installs_offline_into_a_fresh_venv(
    tmp_path: Path, inputs: dict[str, Path], tinyext_wheel: Path, pypi: None
) -> None:
    """This machine's Python and platform as the target: six (lock), iniconfig (PyPI) + tinyext (local)."""
    out = tmp_path / "house"
    r = _cli(*_args(inputs, out), "--local-wheels", tinyext_wheel, cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    assert "--with tiny: 2 wheels" in r.stdout
    m = json.loads((out / "manifest.json").read_text())
    rows = {w["name"]: w for w in m["wheels"]}
    assert set(rows) == {"six", "iniconfig", "tinyext"}
    assert rows["six"]["origin"] == "pypi" and "group" not in rows["six"]
    assert rows["iniconfig"]["origin"] == "pypi" and rows["iniconfig"]["group"] == "tiny"
    assert rows["iniconfig"]["source"]["pypi"] == "iniconfig-2.3.0-py3-none-any.whl"
    ext = rows["tinyext"]
    assert ext["origin"] == "local build" and ext["file"] == f"tiny/{tinyext_wheel.name}"
    assert ext["source"]["sha256"] == ext["sha256"] == _sha(tinyext_wheel.read_bytes())
    assert any("[tiny]" in w for w in ext["why"]) and any("built locally" in w for w in ext["why"])
    assert m["with"][0]["group"] == "tiny" and len(m["with"][0]["wheels"]) == 2
    assert len(m["chunks"]) >= 2  # 0.01 MiB chunks: the install gathers several

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    env = {
        **{k: v for k, v in os.environ.items() if k != "TARGET_DIR"},
        "PYTHON": str(py),
        "PIP_FIND_LINKS": "",
        "PIP_CONFIG_FILE": os.devnull,
    }
    check = "import six, iniconfig, tinyext; print(six.__version__, tinyext.ANSWER, tinyext.__file__)"
    for how in (["--system"], ["--target", str(tmp_path / "site")]):
        inst = subprocess.run([str(out / "install.sh"), *how], capture_output=True, text=True, env=env, timeout=300)
        assert inst.returncode == 0, inst.stderr
        assert "installed 3 wheels (tiny: 2 in one pip call)" in inst.stdout
        pypath = {"PYTHONPATH": str(tmp_path / "site")} if how[0] == "--target" else {}
        imp = subprocess.run(
            [str(py), "-c", check], capture_output=True, text=True, env={"PATH": os.environ["PATH"], **pypath}
        )
        version, answer, where = imp.stdout.split()
        assert (version, answer) == ("1.17.0", "7"), imp.stderr
        assert where.startswith(str(tmp_path / "site" if pypath else venv))


def _ns_wheel(src: Path, out: Path, name: str, sub: str, script: str) -> Path:
    """A real wheel (`pip wheel`) with a part of the namespace package `ns` and a console script."""
    (src / "ns" / sub).mkdir(parents=True)
    (src / "ns" / sub / "__init__.py").write_text(f"WHO = {name!r}\ndef main():\n    print(WHO)\n")
    (src / "setup.py").write_text(
        "from setuptools import setup\n"
        f"setup(name={name!r}, version='1.0', packages=['ns.{sub}'],\n"
        f"      entry_points={{'console_scripts': ['{script} = ns.{sub}:main']}})\n"
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        timeout=300,
    )
    return next(out.glob(f"{name}-1.0-*.whl"))


def test_a_group_sharing_folders_with_the_rest_is_merged_not_replaced(tmp_path: Path) -> None:
    """The rest and a group both put files under ns/ and bin/ (as the 7B set and Megatron-Energon do).

    `pip install --target --upgrade` of the group after the rest replaced ns/ and bin/ whole, and
    without --upgrade skipped them; install.sh now merges the group in, and refuses only a shared file.
    """
    stage = tmp_path / "stage"
    (stage / "wheels" / "g").mkdir(parents=True)
    rest = _ns_wheel(tmp_path / "src-a", stage / "wheels", "nsa", "a", "a-cli")
    grp = _ns_wheel(tmp_path / "src-b", stage / "wheels" / "g", "nsb", "b", "b-cli")
    assert {"ns/a/__init__.py", "bin/a-cli"} <= wheel_files(rest)
    check_separate_calls({"the rest": [rest], "--with g": [grp]})  # folders shared, no file
    (tmp_path / "house").mkdir()
    chunks = pack(stage, tmp_path / "house", 1 << 20, xz_level=None)
    wheels = [
        {"file": rest.name, "sha256": _sha(rest.read_bytes())},
        {"file": f"g/{grp.name}", "sha256": _sha(grp.read_bytes()), "group": "g"},
    ]
    script = tmp_path / "house" / "install.sh"
    script.write_text(render_install_sh(chunks, wheels))
    script.chmod(0o755)
    site = tmp_path / "site"
    env = {**os.environ, "PYTHON": sys.executable, "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}
    inst = subprocess.run([str(script), "--target", str(site)], capture_output=True, text=True, env=env, timeout=300)
    assert inst.returncode == 0, inst.stderr
    assert "installed 2 wheels (g: 1 in one pip call)" in inst.stdout
    assert (site / "ns" / "a" / "__init__.py").is_file() and (site / "ns" / "b" / "__init__.py").is_file()
    assert (site / "bin" / "a-cli").is_file() and (site / "bin" / "b-cli").is_file()
    assert not list(tmp_path.glob("site.*.part"))
    imp = subprocess.run(
        [sys.executable, "-c", "import ns.a, ns.b; print(ns.a.WHO, ns.b.WHO)"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(site)},
    )
    assert imp.stdout.split() == ["nsa", "nsb"], imp.stderr
    # a file both would install is still refused
    with pytest.raises(RecipeError, match=r"both install bin/a-cli, but in separate pip calls"):
        check_separate_calls({"the rest": [rest], "--with g": [rest]})
