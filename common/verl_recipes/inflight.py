"""What a command is writing right now: exclusive claims, written-then-renamed outputs, the interrupt line.

Users press Ctrl-C, kill jobs and start two launches at once. Three rules keep that from leaving
anything a later command mistakes for complete:

* A claim (`claim`) is an advisory `flock` on a hidden lock file beside the target
  (`.<name>.lock`), holding the holder's pid and command. It is atomic, so of two commands
  claiming one folder exactly one proceeds and the other gets one line naming the holder. The
  kernel drops the lock when its process dies, however it dies, so a dead holder's claim is taken
  over without anyone deleting a file by hand.
* An output is built under a temporary name beside it (`.<name>.partial-<pid>`) and renamed into
  place only once complete (`staged_dir`, `staged_file`); what the target name holds is therefore
  always a whole output or nothing. The next holder of the claim removes partials a killed writer
  left behind.
* While a command writes, it says what (`writing`, `keep_note`), so an interrupted command prints
  one line naming what was interrupted and what was kept (`interrupted_line`), and exits 130.
* The machine can refuse a write too: a full disk (ENOSPC, EDQUOT), a read-only filesystem
  (EROFS), a folder without write permission (EACCES, EPERM). Such a write fails as the
  interrupted one does (its partial removed, its claim released), and the command prints one line
  naming the path, what was kept and what to do (`fault_line`), and exits 2.

Standard library only (fcntl: Linux and macOS).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from verl_recipes import RecipeError

PARTIAL = ".partial-"  # `.<name>.partial-<pid>`: an output being written
LOCK_SUFFIX = ".lock"  # `.<name>.lock`: the claim on <name>


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}{LOCK_SUFFIX}"


def partial_path(target: Path) -> Path:
    return target.parent / f".{target.name}{PARTIAL}{os.getpid()}"


@dataclass
class Claim:
    """A held claim on `target`; `release` (or the process's exit) ends it."""

    target: Path
    lock: Path
    fd: int
    what: str
    released: bool = field(default=False)
    pid: int = field(default_factory=os.getpid)

    def release(self) -> None:
        if self.released or os.getpid() != self.pid:  # a forked child does not release its parent's claim
            return
        self.released = True
        _held.pop(self.target, None)
        # unlink first, then unlock: a waiter that got the old inode sees it unlinked and retries
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.lock).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.lock)
        os.close(self.fd)


_held: dict[Path, Claim] = {}


def _holder_text(fd: int) -> str:
    """'pid N (command)' from a lock file another process holds (it may still be writing it)."""
    for _ in range(20):
        raw = os.pread(fd, 4096, 0)
        try:
            info = json.loads(raw)
            return f"pid {info['pid']} ({info['command']})"
        except (ValueError, KeyError, TypeError):
            time.sleep(0.05)
    return "another process"


def this_command() -> str:
    """This process's command line, shortened for one line."""
    argv = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else ["python"]
    text = " ".join(argv)
    return text if len(text) <= 160 else text[:157] + "..."


def claim(target: Path, what: str) -> Claim:
    """Claim `target` for this process, or raise one line naming the process that holds it.

    Re-claiming a target this process already holds returns the held claim.
    """
    target = Path(os.path.abspath(target))
    if target in _held:
        return _held[target]
    lock = lock_path(target)
    with writing(what, target):  # a fault here names the target, not its hidden lock file
        lock.parent.mkdir(parents=True, exist_ok=True)
        return _claim(target, lock, what)


def _claim(target: Path, lock: Path, what: str) -> Claim:
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_text(fd)
            os.close(fd)
            raise RecipeError(
                f"{what} {target} is claimed by {holder}; wait for it to finish, or use another folder"
            ) from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder released (unlinked) it between our open and our lock: retry
    held = Claim(target, lock, fd, what)
    _held[target] = held
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": this_command(), "since": time.time()}).encode(), 0)
    except OSError:  # a full disk: the empty lock file goes, so it names no holder to the next command
        held.release()
        raise
    return held


@atexit.register
def _release_all() -> None:
    for c in list(_held.values()):
        c.release()


def clear_partials(target: Path) -> list[Path]:
    """Remove what killed writers of `target` left (call with the claim held); returns them."""
    gone = []
    for p in target.parent.glob(f".{target.name}{PARTIAL}*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        gone.append(p)
    return gone


# --- what is being written, for the interrupt line -------------------------------------------

_writing: list[tuple[str, Path]] = []  # (what, target), innermost last
_stopped: list[tuple[str, Path]] = []  # left by an exception, innermost first
_kept: dict[Path, str | Callable[[], str]] = {}  # target -> what stays after an interruption, in words


@contextlib.contextmanager
def writing(what: str, target: Path) -> Iterator[None]:
    """Mark `target` as being written (for `interrupted_line`) while the block runs."""
    entry = (what, target)
    _writing.append(entry)
    try:
        yield
    except BaseException:
        _stopped.append(entry)  # the block's cleanup runs before the interrupt line is printed
        raise
    finally:
        _writing.remove(entry)


def keep_note(target: Path, text: str | Callable[[], str] | None) -> None:
    """What an interruption leaves at `target` (e.g. a run folder marked incomplete); None clears
    it. A function is asked when the line is printed, so the line says what is true then."""
    if text is None:
        _kept.pop(target, None)
    else:
        _kept[target] = text


def interrupted_line(command: str) -> str:
    """The one line an interrupted command prints: what it was writing and what was kept."""
    parts = [f"interrupted: verl-recipes {command}"]
    inner = _writing[-1:] or _stopped[:1]
    if inner:
        what, target = inner[0]
        parts.append(f"while writing {what} {target}; nothing of it was kept ({target} is as it was before)")
    kept = [f"{t}: {text if isinstance(text, str) else text()}" for t, text in _kept.items()]
    if kept:
        parts.append("kept " + "; ".join(kept))
    return ", ".join(parts[:2]) + ("; " + parts[2] if len(parts) > 2 else "")


# --- what the machine refuses: a full disk, a read-only filesystem, no permission -------------

#: errno -> (what the machine said, what to do), for the writes the machine refuses
FAULTS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on the filesystem", "free space there (df -h {dir}) or write elsewhere"),
    errno.EDQUOT: ("the disk quota is used up", "free space within the quota or write elsewhere"),
    errno.EROFS: ("the filesystem is read-only", "write to a writable place"),
    errno.EACCES: ("no permission to write there", "write to a folder you own, or fix its permissions"),
    errno.EPERM: ("no permission to write there", "write to a folder you own, or fix its permissions"),
}


def _named_target(filename: str | None) -> Path | None:
    """The output a failed path stands for: `.<name>.partial-<pid>` and `.<name>.lock` are `<name>`."""
    if not filename:
        return None
    path = Path(os.path.abspath(filename))
    name = path.name
    if name.startswith(".") and (PARTIAL in name or name.endswith(LOCK_SUFFIX)):
        name = name[1:].split(PARTIAL)[0].removesuffix(LOCK_SUFFIX)
        return path.parent / name
    return path


def as_os_error(e: BaseException) -> OSError | None:
    """`e` as an OSError: itself, or a library's error that carries one's number in its text (Rust
    libraries such as Hugging Face tokenizers raise `Exception("No space left on device (os error
    28)")`); None for anything else."""
    if isinstance(e, OSError):
        return e
    m = re.search(r"\(os error (\d+)\)", str(e))
    return OSError(int(m.group(1)), os.strerror(int(m.group(1)))) if m else None


def fault_line(command: str, e: OSError) -> str | None:
    """The one line for a write the machine refused (`FAULTS`), or None for any other OSError.

    It names the path (the output being written, not its hidden temporary name), what the machine
    said, what of it was kept (nothing of a staged output; a run folder marked incomplete) and what
    to do; the command exits 2."""
    if e.errno not in FAULTS:
        return None
    said, todo = FAULTS[e.errno]
    inner = _writing[-1:] or _stopped[:1]
    path = _named_target(e.filename)
    what = ""
    if inner:
        what, target = inner[0]
        if (
            path is None
            or path == target
            or target in path.parents
            or path in target.parents
            or path.parent == target.parent
        ):
            path = target
    where = path or Path.cwd()
    folder = where if where.is_dir() else where.parent
    parts = [f"verl-recipes {command}: {said}: {where}" + (f" ({what})" if what else "")]
    parts.append("nothing half-written was kept there")
    kept = [f"{t}: {text if isinstance(text, str) else text()}" for t, text in _kept.items()]
    if kept:
        parts.append("kept " + "; ".join(kept))
    parts.append(todo.format(dir=folder) + ", then run the command again")
    return "; ".join(parts)


# --- outputs written under a temporary name, then renamed ------------------------------------


@contextlib.contextmanager
def staged_dir(target: Path, what: str) -> Iterator[Path]:
    """A fresh folder to write `target` into; renamed onto `target` when the block completes.

    Claims `target` first (raising one line if another process holds it). An existing `target` is
    replaced only at the end (moved aside, the new one renamed in, the old one removed), so an
    interruption leaves the old one or the new one, never a mix. On any exception (Ctrl-C
    included) the partial folder is removed.
    """
    target = Path(os.path.abspath(target))
    ours = target not in _held
    held = claim(target, what)
    clear_partials(target)
    tmp = partial_path(target)
    tmp.mkdir(parents=True)
    try:
        with writing(what, target):
            yield tmp
            if target.exists():
                old = target.parent / f".{target.name}{PARTIAL}old-{os.getpid()}"
                target.rename(old)
                tmp.rename(target)
                shutil.rmtree(old) if old.is_dir() else old.unlink()
            else:
                tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if ours:
            held.release()


def check_folder(target: Path, what: str = "") -> None:
    """The one line for a file asked to go into a folder that does not exist; a command that writes
    other files before it calls this first, so a bad path writes nothing."""
    if not target.parent.is_dir():
        raise RecipeError(
            f"{what or 'the file'} goes to {target}, but the folder {target.parent} does not exist: "
            "create it or give a path in an existing folder"
        )


@contextlib.contextmanager
def staged_file(target: Path, what: str = "") -> Iterator[Path]:
    """A temporary path beside `target`, renamed onto it (atomically) when the block completes.

    A missing folder is refused here, in one line, before anything is written: the temporary
    path sits in it, so without the check the first write would fail with an OSError naming
    the hidden temporary file, not the path the user gave."""
    check_folder(target, what)
    tmp = partial_path(target)
    try:
        with writing(what or "the file", target):
            yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(target: Path, text: str, what: str = "") -> None:
    """`target.write_text(text)`, but a reader never sees half of it."""
    with staged_file(target, what) as tmp:
        tmp.write_text(text)
