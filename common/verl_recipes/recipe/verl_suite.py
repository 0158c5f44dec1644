"""verl's own example scripts as the planner's test suite (`validation/verl-examples/suite.yaml`).

Each entry records a script of verl's repository by path, the commit it was read at and its
sha256, and the trainer call it makes as data: the Hydra overrides `verl_command` reads from it
(line, canonical `--set` line), or the one line that says why it is out (Megatron, multimodal,
mixture-of-experts, another rollout engine, an Ascend NPU, a construct not read statically). The
scripts themselves are not copied here; `plan --verl-example NAME` and `train --verl-example NAME`
run the stored configuration, and `python -m verl_recipes.recipe.verl_suite --repo GIT_DIR --write`
reads the scripts again at a commit (a verl change that moves a configuration shows in the diff).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError, inflight, one_line_errors
from verl_recipes.paths import repo_root
from verl_recipes.recipe.metadata import Recipe
from verl_recipes.recipe.verl_command import Override, VerlCommand, read_text
from verl_recipes.recipe.verl_job import verl_job
from verl_recipes.recipe.verl_renames import git_out

#: verl's example folders the suite reads, and the quickstart of its documentation
FOLDERS = ("examples/grpo_trainer", "examples/ppo_trainer")
QUICKSTART = "docs/start/quickstart.rst"
#: the environment the scripts are read in: the examples' $HOME paths are data and model folders
READ_ENV = {"HOME": "/home/user"}


HEADER = """\
# verl's example scripts as the planner's suite: each script by path, the commit it was read at and
# its sha256, the trainer call it makes as data ([script line, Hydra override as --set takes it]),
# or why it is out. Written by `python -m verl_recipes.recipe.verl_suite --repo VERL_GIT_DIR
# --commit COMMIT --write`; the scripts are not copied. verl's repository has no v0.9.1 tag at the
# commit read; the schema the overrides are composed against is verl 0.9.1's (images/versions.toml).
"""


#: reasons an entry is out that no --set answers
MEGATRON_OUT = "Megatron (ppo_megatron_trainer): the suite holds verl's FSDP and FSDP2 jobs"
NPU_OUT = "an Ascend NPU script (verl names them *_npu.sh): the suite holds NVIDIA GPU jobs"
HARD_OUT = ("not read: ", MEGATRON_OUT, NPU_OUT)


def suite_file() -> Path:
    return repo_root() / "validation" / "verl-examples" / "suite.yaml"


@dataclass(frozen=True)
class Entry:
    name: str
    path: str
    commit: str
    sha256: str
    config_name: str | None
    overrides: tuple[Override, ...]
    out: str | None  # why the entry is out, or None

    def command(self) -> VerlCommand:
        return VerlCommand(
            f"verl example {self.name} ({self.path} at {self.commit[:9]})",
            0,
            "python3 -m",
            self.config_name,
            self.overrides,
        )


def _override(line: int, text: str) -> Override:
    key = text.lstrip("+~").split("=", 1)[0]
    return Override(text, key, line, text)


def load_suite(path: Path | None = None) -> dict[str, Entry]:
    path = path or suite_file()
    doc = yaml.safe_load(path.read_text())
    out: dict[str, Entry] = {}
    for name, e in doc["examples"].items():
        out[name] = Entry(
            name=name,
            path=e["path"],
            commit=e["commit"],
            sha256=e["sha256"],
            config_name=e.get("config_name"),
            overrides=tuple(_override(int(ln), str(t)) for ln, t in e.get("overrides", [])),
            out=e.get("out"),
        )
    return out


def example_recipe(name: str, sets: Sequence[str] = ()) -> Recipe:
    """A suite entry as `check-bounds` holds its runs: the job's recipe (`verl_job`, with the
    user's `--set` lines where the entry needs one to map) in validation/verl-examples, its runs
    under results/NAME/ and its bounds files under expected/NAME/, named by the rule as a recipe's
    are (`expected/NAME/h100x1-ppo-rank0of1.yaml`)."""
    e = entry(name)
    base = suite_file().parent
    expected = sorted(str(p.relative_to(base)) for p in (base / "expected" / name).glob("*.yaml"))
    return verl_job(e.command(), e.name, sets).recipe.model_copy(update={"dir": base, "expected": expected})


def entry(name: str) -> Entry:
    """One suite entry by name; an unknown name says the nearest, an entry that is out says why."""
    suite = load_suite()
    if name not in suite:
        close = difflib.get_close_matches(name, list(suite), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise RecipeError(f"--verl-example {name}: not in {suite_file().name}{hint}; names: {', '.join(suite)}")
    e = suite[name]
    if e.out and (not e.overrides or e.out.startswith(HARD_OUT)):
        raise RecipeError(f"--verl-example {name}: out of the suite: {e.out}")
    # any other reason is `verl_job`'s own line, said again unless the user's --set answers it
    # (`--set actor_rollout_ref.rollout.name=vllm`)
    return e


def name_of(path: str) -> str:
    """A suite name: `examples/grpo_trainer/run_qwen2-7b.sh` -> `grpo-qwen2-7b`."""
    stem = Path(path).stem.removeprefix("run_")
    folder = Path(path).parent.name
    kind = {"grpo_trainer": "grpo", "ppo_trainer": "ppo"}.get(folder, "quickstart")
    return f"{kind}-{stem}".replace("_", "-").replace(".", "")


def quickstart_command(rst: str) -> str:
    """The GSM8K quickstart's trainer command in verl's docs: the `code-block:: bash` that calls it,
    at its own line numbers (the lines before it left blank)."""
    blocks: list[str] = []
    cur: list[str] = []
    inside = False
    for no, line in enumerate(rst.splitlines(), 1):
        if line.strip().startswith(".. code-block:: bash"):
            inside, cur = True, [""] * no
            continue
        if inside:
            if line.strip() and not line.startswith((" ", "\t")):
                inside = False
                blocks.append("\n".join(cur))
                continue
            cur.append(line[4:] if line.startswith("    ") else line.strip())
    if inside:
        blocks.append("\n".join(cur))
    for b in blocks:
        if "verl.trainer.main_ppo" in b:
            return b
    raise RecipeError("the quickstart has no code block calling verl.trainer.main_ppo")


def _out(cmd: VerlCommand, name: str) -> str | None:
    """Why a script that reads is out of the suite: Megatron, or what `verl_job` refuses."""

    if cmd.config_name == "ppo_megatron_trainer":
        return MEGATRON_OUT
    if "_npu" in name_path(cmd.source):
        return NPU_OUT
    try:
        verl_job(cmd, name)
    except RecipeError as e:
        return str(e)
    return None


def name_path(source: str) -> str:
    return Path(source).name


def read_repo(repo: Path, commit: str) -> dict[str, Any]:
    """Every script of FOLDERS and the quickstart at `commit`, read, and each one's reason where
    it is out."""
    full = git_out(repo, "rev-parse", commit).strip()
    paths = [
        p
        for p in git_out(repo, "ls-tree", "--name-only", full, *(f + "/" for f in FOLDERS)).split()
        if p.endswith(".sh")
    ]
    doc: dict[str, Any] = {}
    for path in [QUICKSTART, *sorted(paths)]:
        text = git_out(repo, "show", f"{full}:{path}")
        body = quickstart_command(text) if path == QUICKSTART else text
        rec: dict[str, Any] = {"path": path, "commit": full, "sha256": hashlib.sha256(text.encode()).hexdigest()}
        try:
            cmd = read_text(body, path, env=READ_ENV)
        except RecipeError as e:
            rec["out"] = f"not read: {e}"
        else:
            if cmd.config_name:
                rec["config_name"] = cmd.config_name
            rec["overrides"] = [[o.line, o.text] for o in cmd.overrides]
            why = _out(cmd, name_of(path))
            if why:
                rec["out"] = why
        doc["gsm8k-quickstart" if path == QUICKSTART else name_of(path)] = rec
    return doc


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_recipes.recipe.verl_suite", description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, required=True, help="a git directory of verl (bare is fine)")
    p.add_argument("--commit", default="HEAD")
    p.add_argument("--write", action="store_true", help="write suite.yaml (else print it)")
    a = p.parse_args(argv)
    path = suite_file()
    examples = read_repo(a.repo, a.commit)
    body = yaml.safe_dump({"examples": examples}, sort_keys=False, width=200, default_flow_style=None)
    text = HEADER + body
    if a.write:
        inflight.write_text(path, text, "the suite")
        print(f"wrote {path}: {len(examples)} scripts")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
