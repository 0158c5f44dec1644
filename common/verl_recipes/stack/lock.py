"""The hashed lock of the pinned stack, for a target Python and platform, not this machine's.

The GPU host has no internet and a preinstalled stack, and the container images install from the
same file, so the lock is resolved with `uv pip compile` for the target's interpreter and
platform tags. uv prefers the versions it finds in an existing output file; we seed that file with
the target's `pip freeze` (or the previous lock) so the resolution keeps what the target already
has wherever the pins allow it, and the offline wheelhouse then carries only the difference.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from verl_recipes import RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.stack.pins import gpu_pins, load_pins

# versions.toml [gpu] keys that are not distributions, and the extras each distribution needs.
_NOT_PACKAGES = {"cuda"}
_EXTRAS = {"verl": "verl-core", "ray": "default"}
_PLATFORM_RE = re.compile(r"^manylinux_(\d+)_(\d+)_(x86_64|aarch64)$")


def canonical(name: str) -> str:
    """PEP 503 normalized name, so `PyYAML`, `pyyaml` and `py_yaml` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Target:
    """The interpreter and platform the wheels are for."""

    python: str  # "3.12"
    platform: str  # "manylinux_2_28_x86_64"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d+", self.python):
            raise RecipeError(f"--python {self.python!r}: give major.minor, e.g. --python 3.12")
        if not _PLATFORM_RE.match(self.platform):
            raise RecipeError(f"--platform {self.platform!r}: give a manylinux tag, e.g. manylinux_2_28_x86_64")

    @property
    def uv_platform(self) -> str:
        major, minor, arch = _PLATFORM_RE.match(self.platform).groups()  # type: ignore[union-attr]
        return f"{arch}-manylinux_{major}_{minor}"

    @property
    def py_nodot(self) -> str:
        return self.python.replace(".", "")

    def default_lock(self, root: Path | None = None) -> Path:
        return (root or repo_root()) / "images" / "lock" / f"gpu-py{self.py_nodot}.txt"


def gpu_target(root: Path | None = None) -> Target:
    """The H200 host and the GPU image: versions.toml [python] gpu on manylinux_2_28 x86_64."""
    pins = load_pins((root or repo_root()) / "images" / "versions.toml")
    return Target(python=str(pins["python"]["gpu"]), platform="manylinux_2_28_x86_64")


def stack_requirements(root: Path | None = None) -> list[str]:
    """The pinned GPU stack plus this project's own runtime dependencies, as requirement lines.

    The project itself is not in the lock (it is built from the checkout); its dependencies are,
    so a wheelhouse that carries the project wheel carries what it imports too.
    """
    root = root or repo_root()
    pins = gpu_pins(root / "images" / "versions.toml")
    reqs = []
    for name, version in pins.items():
        if name in _NOT_PACKAGES:
            continue
        extra = f"[{_EXTRAS[name]}]" if name in _EXTRAS else ""
        reqs.append(f"{name}{extra}=={version}")
    project = load_pins(root / "pyproject.toml")["project"]
    reqs.extend(str(d) for d in project["dependencies"])
    return reqs


@dataclass
class Pin:
    """One locked distribution: exact version, allowed sha256 hashes and who asked for it."""

    name: str
    version: str
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)
    line: int = 0  # where its entry starts in the lock file (1-based)


# An entry's first line: `name==version`, with extras, as uv and pip-compile write it.
_ENTRY_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)")


def entry_name(line: str) -> str | None:
    """The canonical name whose entry this lock line starts, or None (hashes, `# via`, comments)."""
    m = _ENTRY_RE.match(line.strip())
    return canonical(m.group(1)) if m else None


def parse_lock_text(text: str) -> dict[str, Pin]:
    """A `uv pip compile --generate-hashes` output: canonical name -> Pin (the one lock parser)."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    in_via = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        m = _ENTRY_RE.match(line)
        if m:
            current = Pin(canonical(m.group(1)), m.group(2), line=number)
            pins[current.name] = current
            in_via = False
        if current is None:
            continue
        current.hashes.extend(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
        if line.startswith("# via"):
            rest = line[len("# via") :].strip()
            in_via = not rest
            if rest:
                current.via.append(rest)
        elif in_via and line.startswith("#   "):
            current.via.append(line[1:].strip())
        elif not line.startswith("#"):
            in_via = False
    return pins


def parse_lock(path: Path) -> dict[str, Pin]:
    """A lock file's entries; a file with none says how to regenerate it."""
    pins = parse_lock_text(path.read_text())
    if not pins:
        raise RecipeError(f"{path}: no `name==version` lines; regenerate it with `nox -s lock`")
    return pins


def parse_freeze(path: Path) -> dict[str, str]:
    """A `pip freeze` file: canonical name -> version (local labels such as +cu130 dropped)."""
    if not path.is_file():
        raise RecipeError(f"--have {path}: no such file; give the target's `pip freeze` output")
    have = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            have[canonical(name.split("[")[0])] = version.split("+")[0].strip()
    return have


def uv_exe() -> str:
    """uv from PATH or next to this interpreter (the dev venv); a clear error otherwise."""
    for cand in (shutil.which("uv"), str(Path(sys.executable).with_name("uv"))):
        if cand and Path(cand).is_file():
            return cand
    raise RecipeError("uv not found: pip install uv (it resolves the lock for the target platform)")


def compile_lock(
    target: Target,
    out: Path,
    requirements: list[str],
    seed: Path | None = None,
    overrides: list[str] | None = None,
    what: str = "the pinned stack (images/versions.toml)",
    made_by: str = "`nox -s lock` (verl_recipes.stack.lock.refresh_lock)",
) -> Path:
    """Resolve `requirements` for `target` with hashes into `out`, seeded with `seed`'s versions.

    deepspeed is sdist-only and its setup.py imports torch, so uv builds its metadata with this
    interpreter's environment (no build isolation, DS_BUILD_OPS=0) instead of an isolated one.
    `overrides` replace what the requirements' own metadata asks for (uv's `--override`: a peer's
    pin the host cannot meet, stack.peer_pins); `what` and `made_by` write the lock's header.
    """
    if any(r.startswith("deepspeed") for r in requirements) and importlib.util.find_spec("torch") is None:
        raise RecipeError(
            f"locking deepspeed needs torch in {sys.prefix} (its setup.py imports it): "
            "pip install torch there, or run from the dev environment"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        req_in = Path(tmp) / "requirements.in"
        req_in.write_text("\n".join(requirements) + "\n")
        over = ["--override", "overrides.txt"] if overrides else []
        if overrides:
            (Path(tmp) / "overrides.txt").write_text("\n".join(overrides) + "\n")
        work_out = Path(tmp) / "lock.txt"
        if seed is not None and seed.is_file():
            # Preferences only: the versions the target has (local labels like +cu130 stripped).
            work_out.write_text(
                "".join(f"{n}=={v}\n" for n, v in parse_freeze(seed).items()) if seed != out else seed.read_text()
            )
        env = {
            **os.environ,
            "DS_BUILD_OPS": "0",
            "VIRTUAL_ENV": sys.prefix,
            "UV_PYTHON_DOWNLOADS": "never",
            "SSL_CERT_FILE": os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"),
        }
        cmd = [
            uv_exe(), "pip", "compile", req_in.name, "-o", str(work_out),
            "--python-version", target.python, "--python-platform", target.uv_platform,
            "--generate-hashes", "--no-header", "--no-build-isolation-package", "deepspeed",
            "--index-url", "https://pypi.org/simple", "--quiet", *over,
        ]  # fmt: skip
        # Run where requirements.in is, so the lock's "# via -r requirements.in" has no temp path.
        proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-4:])
            raise RecipeError(f"uv could not resolve {what} for {target.python}/{target.platform}: {tail}")
        header = (
            f"# {what[:1].upper()}{what[1:]} resolved for Python {target.python} on {target.platform}, with hashes.\n"
            f"# Generated by {made_by}; do not edit by hand.\n"
        )
        _replace(out, header + work_out.read_text())
    return out


#: pip constraints from the lock for environments that take their torch from the host (the CPU venv
#: of `nox -s recipe-*` and `nox -s tests`)
CONSTRAINTS = Path("images") / "lock" / "constraints.txt"
# torch and what is built against one torch release (CUDA libraries, vLLM and its kernels): a CPU
# host installs the CPU torch of images/versions.toml [cpu], not the lock's GPU build
_HOST_TORCH = re.compile(
    r"^(torch|torchaudio|torchvision|triton|nvidia-(?!ml-py).*|cuda-.*|vllm|flashinfer-.*|xgrammar)$"
)


def constraints_text(pins: dict[str, Pin], names: list[str], lock_name: str) -> str:
    """images/lock/constraints.txt: the lock's `name==version` of each pinned package of the stack
    (versions.toml [gpu]) but torch's family, so a venv built on the host's torch gets the lock's
    peft, transformers, ray... and `verify` finds the pinned versions. Only the stack's own pins:
    the lock's other entries are resolved for the GPU image's Python and platform, and some have
    no wheel elsewhere. Generated by `nox -s lock`; tests/test_pins.py fails when it drifts."""
    head = (
        f"# pip constraints: the stack's pinned versions from {lock_name}, torch's family left to the host.\n"
        "# Generated by `nox -s lock` (verl_recipes.stack.lock.constraints_text); do not edit by hand.\n"
    )
    keep = sorted({canonical(n) for n in names} - {n for n in map(canonical, names) if _HOST_TORCH.match(n)})
    missing = [n for n in keep if n not in pins]
    if missing:
        raise RecipeError(f"{lock_name} lacks {', '.join(missing)}, pinned in images/versions.toml; run `nox -s lock`")
    return head + "".join(f"{n}=={pins[n].version}\n" for n in keep)


def write_constraints(root: Path | None = None) -> Path:
    root = root or repo_root()
    lock = gpu_target(root).default_lock(root)
    names = [n for n in gpu_pins(root / "images" / "versions.toml") if n not in _NOT_PACKAGES]
    out = root / CONSTRAINTS
    _replace(out, constraints_text(parse_lock(lock), names, lock.relative_to(root).as_posix()))
    return out


def _replace(path: Path, text: str) -> None:
    """Write `path` under a temporary name and rename it: a reader never sees half a lock (this
    module runs in the image build, where only stack/ and the package root are copied)."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def refresh_lock(target: Target | None = None, have: Path | None = None, root: Path | None = None) -> Path:
    """Rewrite images/lock/gpu-py312.txt: what `nox -s lock` calls after a pin changes.

    Seeds from the existing lock (stable re-locks) or, the first time, from the H200 host's
    `pip freeze`, so the lock prefers what the target already has.
    """
    root = root or repo_root()
    target = target or gpu_target(root)
    out = target.default_lock(root)
    seed = have or (out if out.is_file() else root / "gpu/hosts/2026-11-29-h200x1/pip-freeze.txt")
    lock = compile_lock(target, out, stack_requirements(root), seed=seed)
    write_constraints(root)
    return lock
