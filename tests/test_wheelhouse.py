"""The offline wheelhouse: lock parsing, file choice for a foreign target, packing, install.sh.

Most tests build tiny synthetic wheels and run the real install.sh offline. One test goes to
PyPI (skipped when it is unreachable): it resolves the stack for a plain CPU Python 3.11 target,
carries two small packages plus this project, and installs them into a fresh venv offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from verl_recipes import RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.stack.lock import Pin, Target, canonical, gpu_target, parse_freeze, parse_lock
from verl_recipes.stack.pins import gpu_pins
from verl_recipes.stack.wheelhouse.build import Excludes, load_excludes, ready_text, select
from verl_recipes.stack.wheelhouse.fetch import choose_file, repack_wheel, target_tags
from verl_recipes.stack.wheelhouse.pack import CHUNK_PREFIX, pack, render_install_sh

ROOT = repo_root()
LOCK_SAMPLE = """\
# header
Foo_Bar==1.2.0 \\
    --hash=sha256:{a} \\
    --hash=sha256:{b}
    # via
    #   verl
    #   vllm
torch==2.11.0 \\
    --hash=sha256:{c}
    # via -r requirements.in
""".format(a="a" * 64, b="b" * 64, c="c" * 64)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(dest: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid pure-Python wheel with a correct RECORD."""
    dist = f"{name}-{version}.dist-info"
    meta = {
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    allfiles = {**files, **meta}
    record = "".join(f"{p},sha256={_sha(d)},{len(d)}\n" for p, d in allfiles.items()) + f"{dist}/RECORD,,\n"
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in allfiles.items():
            z.writestr(p, d)
        z.writestr(f"{dist}/RECORD", record)
    return path


# --------------------------------------------------------------------------- lock and target


def test_parse_lock_reads_versions_hashes_and_via(tmp_path: Path) -> None:
    (tmp_path / "lock.txt").write_text(LOCK_SAMPLE)
    lock = parse_lock(tmp_path / "lock.txt")
    assert set(lock) == {"foo-bar", "torch"}
    assert lock["foo-bar"].version == "1.2.0"
    assert lock["foo-bar"].hashes == ["a" * 64, "b" * 64]
    assert lock["foo-bar"].via == ["verl", "vllm"]
    assert lock["torch"].via == ["-r requirements.in"]


def test_committed_lock_matches_the_pins() -> None:
    """A pin changed in images/versions.toml without `nox -s lock` fails here."""
    lock = parse_lock(gpu_target(ROOT).default_lock(ROOT))
    stale = {
        name: (version, lock[canonical(name)].version if canonical(name) in lock else None)
        for name, version in gpu_pins(ROOT / "images" / "versions.toml").items()
        if name != "cuda" and (canonical(name) not in lock or lock[canonical(name)].version != version)
    }
    assert not stale, f"pin -> (versions.toml, lock): {stale}; run `nox -s lock`"
    assert all(pin.hashes for pin in lock.values())


def test_parse_freeze_drops_local_labels_and_normalizes(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("PyYAML==6.0.3\ntorch==2.11.0+cu130\n# comment\n-e git+x#egg=y\n")
    assert parse_freeze(tmp_path / "f.txt") == {"pyyaml": "6.0.3", "torch": "2.11.0"}
    with pytest.raises(RecipeError, match="no such file"):
        parse_freeze(tmp_path / "missing.txt")


def test_target_tags_are_the_targets_not_this_machines() -> None:
    tags = target_tags(Target("3.12", "manylinux_2_28_x86_64"))
    assert tags[0] == "cp312-cp312-manylinux_2_28_x86_64"
    assert "cp312-cp312-manylinux2014_x86_64" in tags and "py3-none-any" in tags
    assert "cp38-abi3-manylinux_2_28_x86_64" in tags
    assert not any("manylinux_2_31" in t or "cp311-cp311" in t or "aarch64" in t for t in tags)
    with pytest.raises(RecipeError, match="manylinux"):
        Target("3.12", "linux_x86_64")
    with pytest.raises(RecipeError, match=r"major\.minor"):
        Target("312", "manylinux_2_28_x86_64")


def _f(name: str, sha: str) -> dict[str, object]:
    return {"filename": name, "url": f"https://x/{name}", "hashes": {"sha256": sha}}


def test_choose_file_prefers_best_wheel_checks_hash_and_falls_back_to_sdist() -> None:
    tags = target_tags(Target("3.12", "manylinux_2_28_x86_64"))
    pin = Pin("pkg", "1.0", hashes=["1" * 64, "2" * 64, "3" * 64, "4" * 64])
    files = [
        _f("pkg-1.0-py3-none-any.whl", "1" * 64),
        _f("pkg-1.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "2" * 64),
        _f("pkg-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", "3" * 64),
        _f("pkg-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "9" * 64),  # hash not in the lock
        _f("pkg-1.0.tar.gz", "4" * 64),
    ]
    assert choose_file(pin, files, tags)["filename"].startswith("pkg-1.0-cp312-cp312-manylinux_2_17")
    newer = [_f("pkg-1.0-cp39-abi3-manylinux_2_31_x86_64.whl", "1" * 64), _f("pkg-1.0.tar.gz", "4" * 64)]
    chosen = choose_file(pin, newer, tags)
    assert chosen["filename"] == "pkg-1.0.tar.gz" and "newer glibc" in chosen["hint"]
    with pytest.raises(RecipeError, match="no wheel"):
        choose_file(pin, [_f("pkg-1.0-cp311-cp311-win_amd64.whl", "1" * 64)], tags)


# --------------------------------------------------------------------------- selection and excludes


def test_real_excludes_file_parses_and_every_rule_has_a_reason() -> None:
    ex = load_excludes(ROOT / "images" / "wheelhouse-excludes.toml")
    assert "flashinfer-cubin" in ex.packages and all(len(r) > 20 for r in ex.packages.values())
    assert any(s.package == "vllm" and s.path.endswith("_vllm_fa2_C.abi3.so") for s in ex.strips)


def test_excludes_rule_without_reason_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.toml").write_text('[[package]]\nname = "av"\n')
    with pytest.raises(RecipeError, match="reason"):
        load_excludes(tmp_path / "x.toml")


def test_selection_drops_what_the_target_has_and_excludes_by_rule() -> None:
    lock = {
        "torch": Pin("torch", "2.11.0"),
        "transformers": Pin("transformers", "5.10.4"),
        "av": Pin("av", "19.0.2"),
        "six": Pin("six", "1.17.0"),
    }
    have = {"torch": "2.11.0", "transformers": "5.17.0"}
    p = select(lock, have, Excludes({"av": "video"}, []), None)
    assert [q.name for q in p.carry] == ["six", "transformers"]
    assert [q.name for q in p.on_target] == ["torch"]
    assert [(q.name, r) for q, r in p.excluded] == [("av", "video")]
    assert [q.name for q in select(lock, have, Excludes({}, []), {"six"}).carry] == ["six"]
    with pytest.raises(RecipeError, match="not in the lock"):
        select(lock, have, Excludes({}, []), {"nope"})


def test_strip_wheel_removes_files_and_their_record_lines(tmp_path: Path) -> None:
    src = make_wheel(
        tmp_path, "big", "1.0", {"big/__init__.py": b"", "big/fa2.so": b"x" * 1000, "big/sm100/k.bin": b"y"}
    )
    (tmp_path / "out").mkdir()
    out, removed, freed = repack_wheel(src, tmp_path / "out", ["big/fa2.so", "big/sm100/*"], stored=True)
    assert sorted(removed) == ["big/fa2.so", "big/sm100/k.bin"] and freed == 1001
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        record = z.read("big-1.0.dist-info/RECORD").decode()
    assert "big/fa2.so" not in names and "big/__init__.py" in names
    assert "fa2.so" not in record and "sm100" not in record and "big/__init__.py" in record
    assert {i.compress_type for i in zipfile.ZipFile(out).infolist()} == {zipfile.ZIP_STORED}


def test_ready_lists_sizes_chunks_and_the_15_biggest_wheels() -> None:
    wheels = [{"name": f"p{i}", "version": "1", "file": f"p{i}.whl", "size": i * 2**20} for i in range(1, 21)]
    m = {
        "target": {"python": "3.12", "platform": "manylinux_2_28_x86_64"},
        "wheels": wheels,
        "on_target": [],
        "excluded": [],
        "chunks": [{"file": CHUNK_PREFIX + "000"}, {"file": CHUNK_PREFIX + "001"}],
        "total_wheel_bytes": 210 * 2**20,
        "total_chunk_bytes": 120 * 2**20,
        "compression": "xz -6",
    }
    text = ready_text(m)
    assert "wheels: 20 (210.0 MiB)" in text and "chunks: 2 (120.0 MiB" in text
    listed = [ln.split()[-1] for ln in text.splitlines() if ln.endswith(".whl")]
    assert listed == [f"p{i}.whl" for i in range(20, 5, -1)]


# --------------------------------------------------------------------------- pack and install.sh


@pytest.fixture(params=[6, None], ids=["xz", "plain-tar"])
def house(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A wheelhouse of two synthetic wheels split into at least three chunks, xz or plain tar."""
    stage = tmp_path / "stage"
    (stage / "wheels").mkdir(parents=True)
    blob = os.urandom(300_000)  # incompressible, so the xz stream needs several 100 KiB chunks
    w1 = make_wheel(
        stage / "wheels",
        "tinyone",
        "0.1",
        {"tinyone/__init__.py": b"ANSWER = 42\n", "tinyone/blob.bin": blob},
    )
    w2 = make_wheel(stage / "wheels", "tinytwo", "0.2", {"tinytwo.py": b"NAME = 'two'\n"})
    out = tmp_path / "house"
    out.mkdir()
    chunks = pack(stage, out, 100 * 1024, xz_level=request.param)
    wheels = [{"file": w.name, "sha256": _sha(w.read_bytes())} for w in (w1, w2)]
    (out / "install.sh").write_text(render_install_sh(chunks, wheels))
    (out / "install.sh").chmod(0o755)
    (out / "manifest.json").write_text(json.dumps({"chunks": chunks}))
    return out


def _sh(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "TARGET_DIR"}
    full_env = {**base, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=full_env, timeout=300)


def _chunks(d: Path) -> list[Path]:
    return sorted(d.glob("wheelhouse.tar*.part-*"))


def test_pack_splits_into_chunks_of_the_given_size(house: Path) -> None:
    chunks = _chunks(house)
    assert len(chunks) >= 3
    xz = (house / "install.sh").read_text().count("COMPRESSION=xz") == 1
    assert all(c.name.startswith(CHUNK_PREFIX if xz else "wheelhouse.tar.part-") for c in chunks)
    if xz:
        assert chunks[0].read_bytes()[:6] == b"\xfd7zXZ\x00"
    assert all(c.stat().st_size == 100 * 1024 for c in chunks[:-1])
    manifest = json.loads((house / "manifest.json").read_text())
    assert [c["sha256"] for c in manifest["chunks"]] == [_sha(c.read_bytes()) for c in chunks]


def test_install_sh_is_shellcheck_clean(house: Path) -> None:
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed (apt-get install -y shellcheck)")
    r = _sh("shellcheck", house / "install.sh")
    assert r.returncode == 0, r.stdout


def test_install_sh_installs_into_target_and_imports(house: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    r = _sh(house / "install.sh", "--target", target)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().count("\n") == 0 and "installed 2 wheels" in r.stdout
    code = "import tinyone, tinytwo; print(tinyone.ANSWER, tinytwo.NAME)"
    imp = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    assert imp.stdout.split() == ["42", "two"], imp.stderr


def test_install_sh_needs_a_destination(house: Path) -> None:
    r = _sh(house / "install.sh")
    assert r.returncode != 0 and "give --target DIR" in r.stderr


def test_install_sh_refuses_a_corrupt_chunk(house: Path, tmp_path: Path) -> None:
    victim = _chunks(house)[1]
    data = bytearray(victim.read_bytes())
    data[500] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = _sh(house / "install.sh", "--target", tmp_path / "site")
    assert r.returncode != 0
    assert f"{victim.name} is corrupt" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "site").exists()


def test_install_sh_lists_missing_chunks(house: Path, tmp_path: Path) -> None:
    gone = _chunks(house)[1:3]
    for c in gone:
        c.unlink()
    r = _sh(house / "install.sh", "--target", tmp_path / "site")
    assert r.returncode != 0
    assert "missing chunks" in r.stderr and all(c.name in r.stderr for c in gone)


def test_install_sh_stages_chunks_from_separate_transfers(house: Path, tmp_path: Path) -> None:
    chunks = _chunks(house)
    first, second = tmp_path / "t1", tmp_path / "t2"
    for d, part in ((first, chunks[:1]), (second, chunks[1:])):
        d.mkdir()
        for c in part:
            shutil.copy2(c, d / c.name)
    shutil.copy2(house / "install.sh", first / "install.sh")
    staging = tmp_path / "staging"

    r1 = _sh(first / "install.sh", "--stage", first, "--into", staging)
    assert r1.returncode == 0 and "staged 1 of" in r1.stdout and chunks[1].name in r1.stdout
    early = _sh(staging / "install.sh", "--install", staging, "--target", tmp_path / "site")
    assert early.returncode != 0 and chunks[-1].name in early.stderr

    r1again = _sh(first / "install.sh", "--stage", first, "--into", staging)  # idempotent
    assert r1again.returncode == 0 and "staged 1 of" in r1again.stdout
    r2 = _sh(staging / "install.sh", "--stage", second, "--into", staging)
    assert r2.returncode == 0 and "all" in r2.stdout, r2.stderr

    done = _sh(staging / "install.sh", "--install", staging, "--target", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "tinyone" / "__init__.py").is_file()


def test_install_sh_stage_refuses_a_corrupt_chunk(house: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    c = _chunks(house)[0]
    (bad / c.name).write_bytes(c.read_bytes()[:-10])
    r = _sh(house / "install.sh", "--stage", bad, "--into", tmp_path / "staging")
    assert r.returncode != 0 and "corrupt" in r.stderr
    assert not (tmp_path / "staging" / c.name).exists()


# --------------------------------------------------------------------------- the real thing, small


@pytest.mark.slow
def test_cpu_py311_wheelhouse_installs_offline_into_a_fresh_venv(tmp_path: Path, pypi: None) -> None:
    """The real pipeline for a CPU 3.11 target, as the README runs it (`nox -s wheelhouse`, in the
    session's own environment, not the host's python3): lock, download, sdist build, project
    wheel, install."""
    have = tmp_path / "freeze.txt"
    have.write_text("pip==23.2.1\n")
    out, lock = tmp_path / "house", tmp_path / "lock.txt"
    cmd = [
        sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "wheelhouse", "--", "--python", "3.11",
        "--platform", "manylinux_2_28_x86_64", "--have", str(have), "--out", str(out), "--lock", str(lock),
        "--only", "six,antlr4-python3-runtime,verl-recipes", "--chunk-mib", "0.05",
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    assert {w["name"] for w in m["wheels"]} == {"six", "antlr4-python3-runtime", "verl-recipes"}
    antlr = next(w for w in m["wheels"] if w["name"] == "antlr4-python3-runtime")
    assert "built_from_sdist" in antlr["source"] and antlr["why"]
    assert sum(w["size"] for w in m["wheels"]) < 2 * 2**20 and len(m["chunks"]) >= 2
    assert "torch" in {canonical(n.split("==")[0]) for n in lock.read_text().split() if "==" in n}

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    env = {"PYTHON": str(py), "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}
    inst = _sh(out / "install.sh", "--system", env=env)
    assert inst.returncode == 0, inst.stderr
    check = "import six, antlr4, verl_recipes; print(verl_recipes.__version__)"
    imp = subprocess.run([str(py), "-c", check], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert imp.stdout.strip() == "0.1.0", imp.stderr


@pytest.mark.parametrize("never_writes", [True, False], ids=["no-bytecode-host", "bytecode-host"])
def test_offline_host_install_writes_bytecode_only_where_the_host_never_does(
    house: Path, tmp_path: Path, never_writes: bool
) -> None:
    """The wheels go in with --no-compile, and the H200 host's own torch has no bytecode either
    (0 .pyc for 2141 .py, gpu/hosts/2026-12-01-h200x1-speed-grpo). On a host with
    PYTHONDONTWRITEBYTECODE every new process (vLLM alone starts three per run) would compile its
    imports from source at each start, so `gpu/offline-host.sh install` writes the bytecode of the
    wheelhouse and of the host's packages once, into a prefix the host's folders never see, and every
    process started from there reads it; elsewhere the first import writes it as usual."""
    root = repo_root()
    bindir = Path(sys.executable).parent
    host_site = tmp_path / "host-site"
    host_site.mkdir()
    (host_site / "hostmod.py").write_text("X = 1\n")
    pycache = tmp_path / "site-pycache"
    run = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    run |= {"STAGE": str(tmp_path / "wh-stage"), "SITE": str(tmp_path / "site"), "PYTHON": sys.executable}
    run |= {"HOST_SITE": str(host_site)}
    run["PATH"] = f"{bindir}:{os.environ['PATH']}"
    if never_writes:
        run["PYTHONDONTWRITEBYTECODE"] = "1"
    host = ["bash", str(root / "gpu" / "offline-host.sh")]
    for args in (["stage", str(house)], ["install"]):
        r = subprocess.run([*host, *args], env=run, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    pyc = list(pycache.rglob("*.pyc"))
    assert not list((tmp_path / "site").rglob("*.pyc")) and not list(host_site.rglob("*.pyc"))
    prefix = subprocess.run(
        [*host, "exec", sys.executable, "-c", "import sys; print(sys.pycache_prefix)"],
        env=run,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    if never_writes:
        assert any(p.name.startswith("tinyone") or p.parent.name == "tinyone" for p in pyc), pyc
        assert any(p.name.startswith("hostmod.") for p in pyc), pyc
        assert "written into" in r.stdout and prefix == str(pycache)
    else:
        assert not pycache.exists() and "written into" not in r.stdout and prefix == "None"


def test_offline_host_carries_a_wheelhouse_in_pieces_smaller_than_its_chunks(house: Path, tmp_path: Path) -> None:
    """When a transfer holds less than one chunk beside the tree, `pieces` cuts the chunks again and
    `gather` keeps each piece as it arrives, refuses a corrupt one, and once all are there rebuilds
    the very chunks install.sh checks and stages them: the install then works as from the chunks."""
    host = ["bash", str(repo_root() / "gpu" / "offline-host.sh")]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env |= {"STAGE": str(tmp_path / "wh-stage"), "SITE": str(tmp_path / "site"), "PYTHON": sys.executable}

    def sh(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*host, *map(str, args)], env=env, capture_output=True, text=True, timeout=300)

    out = tmp_path / "pieces"
    made = sh("pieces", house, out, "70K")
    assert made.returncode == 0, made.stderr
    pieces = sorted(out.glob("piece-*"))
    total = sum(c.stat().st_size for c in _chunks(house))
    assert len(pieces) == -(-total // (70 * 1024)) and len(pieces) > len(_chunks(house))
    assert all(p.stat().st_size <= 70 * 1024 for p in pieces)
    assert sh("pieces", house, out, "70K").returncode == 2  # an existing folder is never written into
    typo = sh("pieces", house, tmp_path / "typo", "lots")
    assert typo.returncode == 2 and "size lots" in typo.stderr and not (tmp_path / "typo").exists()

    def carry(names: list[str], n: int) -> Path:
        d = tmp_path / f"carry-{n}"
        d.mkdir()
        for name in [*names, "PIECES"]:
            shutil.copy2(out / name, d / name)
        return d

    bad = carry([pieces[0].name], 0)
    (bad / pieces[0].name).write_bytes(b"x" + (bad / pieces[0].name).read_bytes()[1:])
    refused = sh("gather", bad)
    assert refused.returncode == 2 and "corrupt" in refused.stderr
    first = sh("gather", carry([p.name for p in pieces[:2]], 1))
    assert first.returncode == 0 and f"gathered 2 of {len(pieces)}" in first.stdout, first.stderr
    assert "install.sh" in first.stdout and not (tmp_path / "wh-stage").exists()
    rest = sh("gather", carry([p.name for p in pieces[2:]] + ["install.sh", "manifest.json"], 2))
    assert rest.returncode == 0 and "all" in rest.stdout, rest.stderr
    staged = sorted((tmp_path / "wh-stage").glob("wheelhouse.tar*.part-*"))
    assert [_sha(c.read_bytes()) for c in staged] == [_sha(c.read_bytes()) for c in _chunks(house)]
    done = sh("install")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "tinyone" / "__init__.py").is_file()


def test_sdist_build_without_build_tools_says_how_to_get_them(tmp_path: Path) -> None:
    """An interpreter without setuptools and wheel (a bare venv, as the host's python3 can be)
    cannot build an sdist without isolation; the build says so in one line, naming both and the
    nox session that installs them, instead of setuptools' metadata failure."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    deps = tmp_path / "deps"
    import packaging

    shutil.copytree(Path(packaging.__file__).parent, deps / "packaging")
    sdist = tmp_path / "demo-1.0.tar.gz"
    sdist.write_bytes(b"not read: the check comes first")
    code = (
        "import sys\nfrom pathlib import Path\nfrom verl_recipes import RecipeError\n"
        "from verl_recipes.stack.wheelhouse.fetch import build_sdist\n"
        "try:\n    build_sdist(Path(sys.argv[1]), 'f' * 64)\nexcept RecipeError as e:\n    print(e)\n"
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{ROOT / 'common'}:{deps}"}
    env["VERL_RECIPES_CACHE"] = str(tmp_path / "cache")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code, str(sdist)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("building demo-1.0.tar.gz needs setuptools and wheel"), line
    assert "nox -s wheelhouse" in line and "\n" not in line
