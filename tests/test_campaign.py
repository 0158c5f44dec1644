"""gpu/campaign.sh: campaign lines, `requires` (passed / `!failed`), pytest lines, and the status file.

Runs the real script with the real `verl-recipes` on this host; the runs it starts fail fast on
purpose (an unknown recipe), which is what the bisection lines react to.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest


def test_campaign_line_semantics(root: Path, tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "verl-recipes").exists():
        pytest.skip(f"verl-recipes is not installed beside {sys.executable} (pip install -e .)")
    campaign = tmp_path / "campaign.txt"
    campaign.write_text(
        "# comment line\n"
        "bad|60|-|no-such-recipe --steps 1\n"
        "after-pass|60|bad|7b-lora --steps 1\n"
        "after-fail|120|!bad|pytest --collect-only -q tests/test_procs.py\n"
        "never|60|!after-fail-missing|7b-lora\n"
        "script|60|-|bash recipes/verl-vs-deepspeed/run-both.sh not-a-count\n"
    )
    out = tmp_path / "campaign"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    cmd = ["bash", "gpu/campaign.sh", str(campaign), str(out)]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in (out / "status.tsv").read_text().splitlines()]
    status = {r[0]: r[1] for r in rows}
    assert status["bad"] == "2"  # one-line error from verl-recipes train, exit 2
    assert status["after-pass"] == "skipped"
    # pytest -m gpu deselects every test of the file: exit 5 ("no tests collected"), and it did run
    assert status["after-fail"] == "5"
    assert (out / "runs" / "after-fail" / "pytest.log").is_file()
    assert status["never"] == "skipped"
    # `bash SCRIPT ARGS` gets the run folder first: run-both.sh OUT NPROC refuses NPROC "not-a-count"
    assert status["script"] == "2"
    assert "NPROC must be a positive number" in (out / "runs" / "script" / "script.log").read_text()
    assert (out / "DONE").is_file()


def _campaign_lines(path: Path) -> list[tuple[str, str, str, str]]:
    out = []
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        name, limit, requires, what = raw.split("|", 3)
        out.append((name.strip(), limit.strip(), requires.strip(), what.strip()))
    return out


CAMPAIGNS = Path(__file__).parents[1] / "gpu" / "campaigns"


def _check_run_name(
    campaign: str, name: str, args: Any, recipe: Any, sets: Any, layout: Any, earlier: list[str]
) -> None:
    """A `train` line is named `<recipe>/<run name>`, the name `train` gives its arguments on the
    GPU family the name says (`job.run_name`, recipe/run_names.py's rule), so the run folder under
    the campaign's runs/ is the folder committed under recipes/<recipe>/results/; a second line of
    one configuration adds the repeat (`-2`), and `--label WORD` tells two configurations apart."""
    from verl_recipes import RecipeError
    from verl_recipes.job import run_name
    from verl_recipes.layout import RankSpec
    from verl_recipes.predict.gpus import catalogue
    from verl_recipes.recipe.run_names import RULE, parse_run_name

    rank = RankSpec(args.rank, layout.world) if args.rank is not None else None
    labels = [*args.label, *(["smoke"] if args.smoke else [])]
    layers = None if args.smoke else args.layers
    folder, _, rest = name.partition("/")
    try:
        got = parse_run_name(rest, recipe.variants) if folder == recipe.id else None
    except RecipeError:
        got = None
    family = got.gpu if got is not None else "h200"
    want = run_name(
        recipe, args.variant, layout, family, sets=sets, layers=layers, cap_gib=args.cap_gib, rank=rank, labels=labels
    )
    repeat = (
        got.repeat if got is not None and got.configuration == want and f"{recipe.id}/{want.text}" in earlier else None
    )
    right = f"{recipe.id}/{replace(want, repeat=repeat).text}"
    families = {gpu_id.split("-")[0] for gpu_id in catalogue()}
    assert name == right and got is not None and family in families, (
        f"gpu/campaigns/{campaign}: the line {name!r} runs as {right!r}: name it so (`train` names a run "
        f"<recipe>/{RULE} from its arguments, on the GPU family the name says, one of {sorted(families)}; "
        "a repeat of an earlier line adds -2, -3; --label WORD tells two lines apart)"
    )


@pytest.mark.parametrize("campaign", sorted(p.name for p in CAMPAIGNS.glob("*.txt") if p.name != "order.txt"))
def test_committed_gpu_campaigns_compose(root: Path, campaign: str, tmp_path: Path) -> None:
    """A typo in a committed GPU campaign costs GPU time on the host, so each line is checked here:
    unique names, `requires` naming an earlier line, existing scripts and test files, and every
    `train` line parsed by the real `train` parser and composed against verl's config schema with
    the GPU layout the launcher would give it (no model or dataset is made), and a rank rehearsal's
    share of the job split from it."""
    import argparse
    import shlex

    from verl_recipes import train
    from verl_recipes.job import recipe_sets_layout
    from verl_recipes.recipe.run_config import compose_run

    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    seen: list[str] = []
    for name, limit, requires, what in _campaign_lines(CAMPAIGNS / campaign):
        assert name not in seen, f"{campaign}: {name} twice"
        assert limit.isdigit() and 0 < int(limit) <= 1800, f"{campaign}: {name}: limit {limit!r}"
        if requires != "-":
            assert requires.lstrip("!") in seen, f"{campaign}: {name} requires {requires}, not an earlier line"
        seen.append(name)
        words = shlex.split(what)
        if words[0] == "pytest":
            for w in words[1:]:
                if w.startswith("tests/"):
                    assert (root / w.split("::")[0]).is_file(), f"{campaign}: {name}: no {w}"
            continue
        if words[0] == "bash":
            assert (root / words[1]).is_file(), f"{campaign}: {name}: no {words[1]}"
            continue
        args = parser.parse_args(["train", *words])
        args.rest = []
        recipe, sets, layout = recipe_sets_layout(args)  # a recipe id, or a verl job (--verl-example)
        _check_run_name(campaign, name, args, recipe, sets, layout, seen[:-1])
        cfg = compose_run(
            recipe,
            args.variant,
            list(sets),
            layout,
            model=Path("/m"),
            data=Path("/d"),
            run_dir=tmp_path,
            steps=args.steps,
        )
        assert cfg.trainer.total_training_steps == args.steps
        if args.rank is not None:  # the share of the job one GPU runs must exist
            from verl_recipes.layout import RankSpec
            from verl_recipes.worker.rank_rehearsal import localize
            from verl_recipes.workload.arch import resolve_arch
            from verl_recipes.workload.synth import shape_config

            arch = shape_config(resolve_arch(args.arch or recipe.model.arch), args.layers, "full-width")
            localize(cfg, RankSpec(args.rank, layout.per_node * layout.nnodes), arch)


def test_the_campaign_order_names_committed_campaigns_on_disjoint_gpus() -> None:
    """gpu/campaigns/order.txt is the one place the campaigns' order is written: every line names a
    committed campaign, and the campaigns of one step run on GPUs no other one of that step uses."""
    steps: dict[int, list[set[str]]] = {}
    for raw in (CAMPAIGNS / "order.txt").read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        step, campaign, gpus = raw.split("|")
        assert (CAMPAIGNS / campaign).is_file(), f"order.txt: no campaign {campaign}"
        mine = set(gpus.split(","))
        assert all(not mine & other for other in steps.get(int(step), [])), f"order.txt: step {step} shares GPUs"
        steps.setdefault(int(step), []).append(mine)
    assert sorted(steps) == list(range(1, len(steps) + 1))


def test_a_wait_stopped_from_outside_still_packs_the_results(root: Path, tmp_path: Path) -> None:
    """A GPU host's command limit ends `gpu/offline-host.sh wait` with SIGTERM while a campaign
    runs; the run folders must come back all the same (a folder left on the host is lost with it)."""
    import signal
    import tarfile
    import time

    camp = tmp_path / "campaign"
    run = camp / "speed" / "runs" / "ppo-fast"
    run.mkdir(parents=True)
    (run / "train.log").write_text("step 1\n")
    (camp / "speed" / "status.tsv").write_text("")  # no DONE: the campaign is still running
    out = tmp_path / "out"
    env = {**os.environ, "CAMPAIGN_DIR": str(camp), "SITE": str(tmp_path / "site")}
    proc = subprocess.Popen(
        ["bash", "gpu/offline-host.sh", "wait", "120", str(out)],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    assert rc == 143
    with tarfile.open(out / "results.tgz") as tar:
        assert "./speed/runs/ppo-fast/train.log" in tar.getnames()


def test_results_over_the_size_limit_leave_the_raw_traces_and_keep_their_summary(root: Path, tmp_path: Path) -> None:
    """What comes back from a GPU host is capped in all; a profiled 7B run's raw traces can pass
    that cap and take every run folder of the archive with them. Over PACK_MAX_MIB the archive is
    packed again without profile/*.json(.gz), and the summary beside them still travels."""
    import tarfile

    camp = tmp_path / "campaign"
    prof = camp / "speed" / "runs" / "profile-actor" / "profile"
    prof.mkdir(parents=True)
    (prof / "actor_update_step2.json.gz").write_bytes(os.urandom(2 * 1024 * 1024))  # incompressible
    (prof / "summary.md").write_text("# Trace\n")
    (camp / "speed" / "DONE").write_text("")
    out = tmp_path / "out"
    env = {**os.environ, "CAMPAIGN_DIR": str(camp), "SITE": str(tmp_path / "site")}
    cmd = ["bash", "gpu/offline-host.sh", "wait", "5", str(out)]

    def names(limit_mib: str) -> list[str]:
        r = subprocess.run(cmd, cwd=root, env={**env, "PACK_MAX_MIB": limit_mib}, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        with tarfile.open(out / "results.tgz") as tar:
            return tar.getnames()

    under = names("56")
    assert "./speed/runs/profile-actor/profile/actor_update_step2.json.gz" in under
    over = names("1")
    assert "./speed/runs/profile-actor/profile/summary.md" in over
    assert not any(n.endswith(".json.gz") for n in over), over


def test_import_times_runs_to_the_end_and_times_both_ways(root: Path, tmp_path: Path) -> None:
    """gpu/import-times.sh ended with 141 on the H200 (`sort | head` under pipefail: head closed the
    pipe on a long -X importtime listing), leaving its raw listing behind. It must end with 0 and
    time each import with the bytecode prefix and without it."""
    out = tmp_path / "times"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env |= {"IMPORT_MODULES": "json", "IMPORTTIME_MODULE": "torch", "IMPORT_ROUNDS": "2"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pyc")
    r = subprocess.run(
        ["bash", "gpu/import-times.sh", str(out)], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in (out / "import-times.tsv").read_text().splitlines()[1:]]
    assert sorted((row[0], row[1].split()[0]) for row in rows) == [
        ("1", "bytecode"),
        ("1", "source"),
        ("2", "bytecode"),
        ("2", "source"),
    ]
    assert all(row[2] == "json" and float(row[3]) > 0 for row in rows), rows
    assert len((out / "importtime-vllm-top40.txt").read_text().splitlines()) == 41
    assert not (out / "importtime-vllm.raw").exists()


def _offline_host(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """gpu/offline-host.sh ARGS with ENV, its output captured."""
    cmd = ["bash", "gpu/offline-host.sh", *args]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=60)


def test_a_wait_on_a_host_without_a_campaign_says_so_at_once(root: Path, tmp_path: Path) -> None:
    """A lent host taken back between calls leaves the next call on a bare one: `wait` there says
    so in one line and exits 2 at once, instead of waiting out its limit on nothing."""
    import time

    env = {**os.environ, "CAMPAIGN_DIR": str(tmp_path / "campaign"), "SITE": str(tmp_path / "site")}
    t0 = time.monotonic()
    r = _offline_host(root, env, "wait", "120", str(tmp_path / "out"))
    assert r.returncode == 2 and time.monotonic() - t0 < 30
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no campaign under" in lines[0] and "start the campaign again" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_campaign_that_cannot_start_is_refused_at_once_and_one_that_ends_early_says_so(
    root: Path, tmp_path: Path
) -> None:
    """On a host where the wheelhouse never got installed, `start` once answered "campaign started"
    while the background campaign refused to run, and `wait` then spent its whole limit reporting
    CAMPAIGN RUNNING (the campaign's own refusal wrote no DONE), and the NAME stayed taken. `start`
    refuses such a host itself, in one line; a campaign that ends early, however, writes its exit
    code into DONE, and `wait` returns at once and names it."""
    import time

    camp = tmp_path / "campaign"
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",  # no verl-recipes: nothing installed
        "CAMPAIGN_DIR": str(camp),
        "SITE": str(tmp_path / "site"),
    }
    r = _offline_host(root, env, "start", "gpu/campaigns/rank-followups.txt", "", "followups")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "verl-recipes is not on PATH" in lines[0] and "install" in lines[0]
    assert not (camp / "followups").exists()

    # campaign.sh itself refuses a campaign file that is not there: DONE holds its exit code
    early = camp / "typo"
    r = subprocess.run(
        ["bash", "gpu/campaign.sh", str(tmp_path / "no-such.txt"), str(early)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no campaign file" in r.stderr
    assert (early / "DONE").read_text().strip() == "2"
    t0 = time.monotonic()
    w = _offline_host(root, env, "wait", "120", str(tmp_path / "out"))
    assert w.returncode == 0 and time.monotonic() - t0 < 30
    assert "CAMPAIGN typo ENDED EARLY (exit 2)" in w.stdout
    assert w.stdout.strip().endswith("CAMPAIGN DONE")


@pytest.mark.parametrize(
    "campaign", sorted(p.name for p in [*CAMPAIGNS.glob("7b-prod*.txt"), CAMPAIGNS / "7b-learn.txt"])
)
def test_the_prod_batch_campaigns_name_their_runs_by_the_rule(campaign: str) -> None:
    """A line's name is the run folder its results are committed under, so it follows the rule
    (recipe/run_names.py) with the recipe's variants, the card it is written for first."""
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_names import parse_run_name

    variants = get_recipe("7b-lora").variants
    for name, _, _, _ in _campaign_lines(CAMPAIGNS / campaign):
        assert parse_run_name(name.removeprefix("7b-lora/"), variants).n == 1, f"{campaign}: {name}"


def test_start_takes_the_carried_trees_commit_and_every_run_records_it(root: Path, tmp_path: Path) -> None:
    """The tree reaches a GPU host without an up-to-date .git, so `git rev-parse` there names an
    old commit (a run recorded 625ea80e...-dirty for a tree two days newer). `start` refuses, in
    one line, to run without VERL_RECIPES_GIT_COMMIT (or with something that is not a commit),
    and with it every process of the campaign records that commit through provenance's
    `git_commit`, and `wait` names it; `exec` says in one line when it is not set."""
    import time

    bindir = Path(sys.executable).parent
    if not (bindir / "verl-recipes").exists():
        pytest.skip(f"verl-recipes is not installed beside {sys.executable} (pip install -e .)")
    camp = tmp_path / "campaign"
    script = tmp_path / "commit.sh"
    # a campaign's `bash SCRIPT` line gets its run folder first; the script asks provenance for the commit
    script.write_text(
        'python3 -c "from verl_recipes.measure.provenance import git_commit; print(git_commit())" >"$1/commit"\n'
    )
    campaign = tmp_path / "c.txt"
    campaign.write_text(f"commit|60|-|bash {script}\n")
    env = {k: v for k, v in os.environ.items() if k != "VERL_RECIPES_GIT_COMMIT"}
    env |= {"PATH": f"{bindir}:/usr/bin:/bin", "CAMPAIGN_DIR": str(camp), "SITE": str(tmp_path / "site")}
    for value in (None, "HEAD", "625ea8"):
        r = _offline_host(root, env | ({"VERL_RECIPES_GIT_COMMIT": value} if value else {}), "start", str(campaign))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and r.stdout == "", (value, r.stdout, r.stderr)
        assert len(lines) == 1 and "set VERL_RECIPES_GIT_COMMIT to the commit of the tree you carried" in lines[0]
        assert not camp.exists()
    commit = "0123456789abcdef0123456789abcdef01234567-dirty"
    r = _offline_host(root, env | {"VERL_RECIPES_GIT_COMMIT": commit}, "start", str(campaign), "", "one")
    assert r.returncode == 0 and f"campaign started at commit {commit}" in r.stdout, r.stderr
    deadline = time.monotonic() + 50
    while not (camp / "one" / "DONE").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    w = _offline_host(root, env, "wait", "5", str(tmp_path / "out"))
    assert w.returncode == 0 and w.stdout.strip().endswith("CAMPAIGN DONE"), w.stdout
    assert f"=== one at commit {commit}" in w.stdout
    assert (camp / "one" / "runs" / "commit" / "commit").read_text().strip() == commit
    x = _offline_host(root, env, "exec", "true")
    assert x.returncode == 0 and "exec: VERL_RECIPES_GIT_COMMIT is not set" in x.stderr
    assert _offline_host(root, env | {"VERL_RECIPES_GIT_COMMIT": commit}, "exec", "true").stderr == ""


def test_a_campaign_started_again_under_a_finished_name_is_waited_for(root: Path, tmp_path: Path) -> None:
    """A second `start` under the NAME of a campaign that had ended (gpus-0, the default) once
    kept the first one's DONE: `wait` answered CAMPAIGN DONE at once while the new line ran, and
    the new log replaced the old. The finished campaign's runs, status and log stay; the new lines
    follow them and `wait` waits for them."""
    import time

    bindir = Path(sys.executable).parent
    if not (bindir / "verl-recipes").exists():
        pytest.skip(f"verl-recipes is not installed beside {sys.executable} (pip install -e .)")
    camp = tmp_path / "campaign"
    env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin", "CAMPAIGN_DIR": str(camp), "SITE": str(tmp_path / "site")}
    env["VERL_RECIPES_GIT_COMMIT"] = "0123456789abcdef0123456789abcdef01234567"
    script = tmp_path / "mark.sh"
    script.write_text('sleep "$2"; echo ran >"$1/mark"\n')
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text(f"one|60|-|bash {script} 0\n")
    second.write_text(f"two|60|-|bash {script} 4\n")
    assert _offline_host(root, env, "start", str(first), "0").returncode == 0
    deadline = time.monotonic() + 50
    while not (camp / "gpus-0" / "DONE").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (camp / "gpus-0" / "DONE").read_text().strip() == "0"
    r = _offline_host(root, env, "start", str(second), "0")
    assert r.returncode == 0 and "had ended; its runs and log stay" in r.stdout, r.stdout + r.stderr
    t0 = time.monotonic()
    w = _offline_host(root, env, "wait", "50", str(tmp_path / "out"))
    assert w.returncode == 0 and w.stdout.strip().endswith("CAMPAIGN DONE"), w.stdout
    assert time.monotonic() - t0 >= 2, "wait answered before the new line had run"
    runs = camp / "gpus-0" / "runs"
    assert (runs / "one" / "mark").is_file() and (runs / "two" / "mark").is_file()
    status = (camp / "gpus-0" / "status.tsv").read_text().splitlines()
    assert [line.split("\t")[:2] for line in status] == [["one", "0"], ["two", "0"]]
    log = (camp / "gpus-0" / "campaign.log").read_text()
    assert "campaign: one" in log and "campaign: two" in log


def test_a_line_named_for_another_card_runs_into_a_folder_named_for_this_hosts(root: Path, tmp_path: Path) -> None:
    """Campaign lines are written for one card (`h200x1-...`) and run on whichever host comes; a
    folder named h200x1 holding an H100's run would tell a card it did not run on. gpu/campaign.sh
    names the folder for this host's card (CAMPAIGN_CARD here, NVML on a GPU host) and says so;
    the status line keeps the campaign's name, which a later line's `requires` names. The real
    runner and a real `train --preview` (about 10 s)."""
    bindir = Path(sys.executable).parent
    if not (bindir / "verl-recipes").exists():
        pytest.skip(f"verl-recipes is not installed beside {sys.executable} (pip install -e .)")
    campaign, out = tmp_path / "c.txt", tmp_path / "out"
    campaign.write_text("7b-lora/h200x1-ppo|300|-|7b-lora --preview --steps 1\n")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CAMPAIGN_CARD": "h100"}
    r = subprocess.run(
        ["bash", "gpu/campaign.sh", str(campaign), str(out)], cwd=root, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-2000:]
    moved = out / "runs" / "7b-lora" / "h100x1-ppo"
    said = f"is named for a h200; this host's card is a h100: its run folder is {moved}"
    assert f"== campaign: 7b-lora/h200x1-ppo {said}" in r.stdout, r.stdout
    assert (moved / "verl_config.yaml").is_file() and not (out / "runs" / "7b-lora" / "h200x1-ppo").exists()
    name, rc, _, folder = (out / "status.tsv").read_text().strip().split("\t")
    assert (name, rc, folder) == ("7b-lora/h200x1-ppo", "0", str(moved))
