"""`plan` and `train` on a verl job as its users write it, and verl's examples as the planner's suite.

The job is composed against verl 0.9.1's real Hydra config and judged by the real planner; the
rehearsal runs `train` whole on this CPU (tiny synthetic model, verl's own dataset class).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from verl_recipes.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "verl-scripts"
SCRIPT = FIXTURES / "every-construct.sh"
SUITE = Path(__file__).parents[1] / "validation" / "verl-examples"


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_plan_of_a_script_says_what_it_mapped_and_what_it_does_not_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", "/h")
    assert main(["plan", str(SCRIPT), "--gpu", "h100-80g", "--", "data.train_batch_size=32"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"verl job: {SCRIPT} (28 keys set)"
    assert (
        "mapped: actor_rollout_ref.model.path=/h/models/Qwen2.5-0.5B-Instruct -> bundled architecture "
        "qwen2.5-0.5b (synthetic weights)"
    ) in out
    assert "mapped: trainer.nnodes=1 x trainer.n_gpus_per_node=2 -> the layout planned and rehearsed (2 GPU(s))" in out
    assert "not modelled: actor_rollout_ref.actor.entropy_from_logits_with_chunking" in out
    # the script's $@ (after --) reached the plan, and the script's own keys did
    batch = next(line for line in out if line.startswith("batch: "))
    assert batch.startswith("batch: 32 prompts x n=4, 512+256 tokens each")
    assert any(line.startswith("layout: FSDP over 2 GPU(s)") and "vLLM TP2" in line for line in out)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--", "python3", "-m", "verl.trainer.main_ppo", "actor_rollout_ref.model.path=org/NoSuch-7B"],
            "unknown model id org/NoSuch-7B",
        ),
        (
            [
                "--",
                "python3",
                "-m",
                "verl.trainer.main_ppo",
                "actor_rollout_ref.model.path=Qwen/Qwen3-0.6B",
                "critic.model.fsdp_config.param_ofload=False",
            ],
            # a key neither schema has, in a section verl moved: looked for under the new name
            "unknown verl config key 'critic.model.fsdp_config.param_ofload'; "
            "did you mean 'critic.fsdp.param_offload'?",
        ),
        (
            ["--verl-example", "ppo-deepseek7b-llm"],
            "'trainer.use_legacy_worker_impl': verl's schema had it at commit b178a3cd5, verl 0.9.1's has no such key",
        ),
        (
            [
                "--",
                "python3",
                "-m",
                "verl.trainer.main_ppo",
                "actor_rollout_ref.model.path=Qwen/Qwen3-0.6B",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=3",
                "actor_rollout_ref.actor.use_dynamic_bsz=true",
            ],
            "tensor_model_parallel_size=3 does not divide num_attention_heads=16",
        ),
        ([str(FIXTURES / "no-trainer.sh")], "does not call verl's trainer"),
        (["--verl-example", "grpo-qwen2-5-vl-7b"], "(a multimodal model; the planner models text LMs)"),
        (["--verl-example", "grpo-qwen2-7b-math-megatron"], "out of the suite: Megatron"),
        (["--verl-example", "grpo-qwen2-7b-seq-balance"], "rollout sglang: this project runs vLLM's rollout"),
        (["--verl-example", "grpo-qwen3-8"], "did you mean grpo-qwen3-8b?"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *argv]) == 2
    assert says in _err(capsys)


def test_a_key_verl_moved_since_the_scripts_commit_plans_under_its_new_name() -> None:
    """b178a3cd5's critic.model.fsdp_config.* is verl 0.9.1's critic.fsdp.*: the example composes,
    the header says each rename, and the planner reads the offload under its 0.9.1 name."""
    from verl_recipes.plan.verl_script import compose_job, header
    from verl_recipes.recipe.verl_job import verl_job
    from verl_recipes.recipe.verl_suite import entry

    cmd = entry("ppo-gemma").command()
    job = verl_job(cmd, "ppo-gemma")
    assert (
        "mapped: critic.model.fsdp_config.param_offload=false -> critic.fsdp.param_offload (verl 0.9.1's name for "
        "the key; recipe/verl_renames.yaml)"
    ) in header(job)
    assert "critic.fsdp.optimizer_offload" in job.keys and "critic.model.fsdp_config.optimizer_offload" not in job.keys
    cfg, s = compose_job(job)
    assert cfg.critic.fsdp.param_offload is False and s.critic is not None and not s.critic.param_offload
    # the user's --set comes after the job's renamed line, under the same name
    _, s = compose_job(verl_job(cmd, "ppo-gemma", ["critic.fsdp.param_offload=true"]))
    assert s.critic is not None and s.critic.param_offload


def test_the_rename_table_is_what_both_schemas_give_now() -> None:
    """recipe/verl_renames.yaml derived again from the committed b178a3cd5 extract and the
    installed verl's generated schema: a verl upgrade that moves or restores a key shows here."""
    from verl_recipes.recipe import verl_renames as vr

    again = "regenerate: python -m verl_recipes.recipe.verl_renames --write"
    assert vr.table_text(vr.extract_types(), vr.installed_types()) == vr.TABLE_FILE.read_text(), again
    assert vr.renamed("critic.model.fsdp_config.optimizer_offload") == "critic.fsdp.optimizer_offload"
    # a section with no single new home (reward_model.model.fsdp_config) is not guessed at
    assert vr.renamed("reward_model.model.fsdp_config.param_offload") is None


def test_a_section_moves_where_one_new_section_holds_all_of_it_and_nowhere_else() -> None:
    """The rename rule on small trees: a section gone whole to the one new section holding every key
    of it (same types) moves; one with two such homes, or under a gone section, is not guessed."""
    from verl_recipes.recipe.verl_renames import derive, flatten

    fsdp = {"_target_": "str", "param_offload": "bool"}
    old = flatten(
        {
            "actor": {"fsdp_config": fsdp},
            "critic": {"model": {"path": "str", "fsdp_config": fsdp}},
            "rm": {"model": {"fsdp_config": fsdp}, "sandbox": {"url": "str"}},
        }
    )
    new = flatten(
        {
            "actor": {"fsdp_config": fsdp},
            "critic": {"model": {"path": "str"}, "fsdp": {**fsdp, "seed": "int"}},
            "rm": {"other": "str"},
            "reward": {"sandbox": {"url": "str"}},
            "sandbox": {"url": "str"},
        }
    )
    assert derive(old, new) == {
        "critic.model.fsdp_config": "critic.fsdp",
        "critic.model.fsdp_config._target_": "critic.fsdp._target_",
        "critic.model.fsdp_config.param_offload": "critic.fsdp.param_offload",
    }
    # with a value of another type, the section has no home
    new["critic.fsdp.param_offload"] = "int"
    assert derive(old, new) == {}


def test_the_suite_records_each_script_and_why_one_is_out() -> None:
    doc = yaml.safe_load((SUITE / "suite.yaml").read_text())["examples"]
    assert len(doc) >= 70
    for name, e in doc.items():
        assert e["path"].startswith(("examples/grpo_trainer/", "examples/ppo_trainer/", "docs/start/")), name
        assert len(e["commit"]) == 40 and len(e["sha256"]) == 64, name
        assert e.get("overrides") or e.get("out"), name
    planned = [n for n, e in doc.items() if not e.get("out")]
    assert {"gsm8k-quickstart", "grpo-qwen2-7b", "grpo-qwen3-8b", "ppo-qwen25-32b"} <= set(planned)
    assert "Megatron" in doc["grpo-qwen2-7b-math-megatron"]["out"]


def test_the_planner_keys_are_verl_keys() -> None:
    """Every key `predict.verl_keys` says the planner reads, or knows to leave memory alone, is a
    key of verl 0.9.1's ppo_trainer config (a prefix: a section of it)."""
    from omegaconf import OmegaConf
    from verl_recipes.predict.verl_keys import NO_EFFECT, READ
    from verl_recipes.recipe.compose import compose_verl

    cfg = compose_verl("ppo_trainer")
    megatron = compose_verl("ppo_megatron_trainer")
    missing = []
    for key in (*READ, *NO_EFFECT):
        k = key.rstrip(".")
        parent, _, leaf = k.rpartition(".")
        nodes = [OmegaConf.select(c, parent) for c in (cfg, megatron)]
        # a key of a mapping verl leaves empty for free-form kwargs (override_config, engine_kwargs.vllm)
        if not any(OmegaConf.is_dict(n) and (leaf in list(n.keys()) or len(n) == 0) for n in nodes):
            missing.append(key)
    assert not missing, missing


def test_the_committed_table_is_what_the_planner_says_now() -> None:
    """validation/verl-examples/table.md and the README's summary of it regenerated from
    suite.yaml: a verl or planner change that
    moves a figure shows here. It plans every entry of the suite on three GPUs (about 30 s on a
    loaded 2-core host): the suite is the check, and no smaller sample of it is."""
    from verl_recipes.plan.verl_script import suite_plans, suite_table, with_summary

    rows = suite_plans()
    again = "regenerate: verl-recipes plan --verl-examples --write validation/verl-examples/table.md"
    assert suite_table(rows) == (SUITE / "table.md").read_text(), again
    readme = (SUITE.parents[1] / "README.md").read_text()
    assert with_summary(readme, rows) == readme, again


def test_each_committed_run_stands_behind_its_entry_and_is_held_against_the_planner() -> None:
    """A run in validation/verl-examples/results/<entry>/ is named by the rule, its entry (the
    recipe its provenance names) is the folder's and one of the suite's, its train.log and samples
    are kept gzipped, the table puts its measured peak (the summary's, over every phase) beside the
    prediction, and the planner-errors table holds the planner to it as to a recipe's run."""
    import json

    from verl_recipes.plan.runs import committed_runs
    from verl_recipes.plan.verl_script import measured_runs
    from verl_recipes.recipe.run_names import parse_run_name
    from verl_recipes.recipe.verl_suite import load_suite
    from verl_recipes.rundir import read_provenance

    runs = sorted(p.parent for p in (SUITE / "results").glob("*/*/summary.json"))
    assert runs, "no committed run of a suite entry"
    suite, ran = load_suite(), measured_runs()
    judged = {r.run_dir for r in committed_runs()}
    table = (SUITE / "table.md").read_text()
    for run in runs:
        parse_run_name(run.name, [])
        entry = read_provenance(run).recipe
        assert entry == run.parent.name and entry in suite, f"{run}: provenance names {entry!r}"
        assert (run / "train.log.gz").is_file() and (run / "samples.jsonl.gz").is_file()
        assert not (run / "train.log").exists() and not (run / "samples.jsonl").exists()
        peak = json.loads((run / "summary.json").read_text())["peak"]["gpu"]["0"]["used_gib"]
        name = f"{entry}/{run.name}"
        [m] = [m for m in ran[entry] if m.name == name]
        assert abs(m.peak_gib - peak) < 0.01, (m.peak_gib, peak)
        row = next(ln for ln in table.splitlines() if ln.startswith(f"| [{entry}]("))
        prov = read_provenance(run)
        rank = prov.rank_rehearsal  # a rank rehearsal says so before its link, and each --set it ran with
        said = f", rank rehearsal ({rank.rank} of {rank.world})" if rank else ""
        sets = prov.user_sets
        said += f", with {' '.join(f'`--set {s}`' for s in sets)}" if sets else ""
        assert f"measured{said}: [{name}](results/{name}/report.md), {peak:.2f} GiB" in row
        if suite[entry].out:  # an entry out as written (an sglang rollout) stands on a run of its --set,
            # planned through the --set lines its runs share
            common = [v for v in sets if all(v in m.user_sets for m in ran[entry])]
            as_run = f" (as run: {' '.join(f'`--set {v}`' for v in common)})"
            assert sets and row.split(" | ")[0].endswith(as_run) and row.split(" | ")[1] != "out", row[:300]
        assert run in judged, f"{run.name} is not in validation/planner-errors.md's runs"
    # a run that failed (results/<entry>/failed/<run name>) is judged by the planner-errors table
    # with its cause, but stands behind no entry: its peak is where it stopped
    failed = sorted(p.parent for p in (SUITE / "results").glob("*/failed/*/summary.json"))
    assert failed and all(f in judged for f in failed)
    assert not [m.name for ms in ran.values() for m in ms if "/failed/" in m.name]


def test_train_rehearses_on_a_cpu_the_job_plan_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train --verl-script ... --rank 0` on a CPU: the rank rehearsal of the script's two-GPU job,
    composed as `plan` composes it: the run folder's config reads into the same Setup. It runs the
    whole rehearsal (tiny model, verl's RLHFDataset; about 30 s): that is the claim."""
    from omegaconf import OmegaConf
    from verl_recipes.plan.verl_script import compose_job
    from verl_recipes.predict.inputs import setup_from_config
    from verl_recipes.recipe.verl_command import read_script
    from verl_recipes.recipe.verl_job import verl_job

    monkeypatch.setenv("VERL_RECIPES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", "/h")
    run = tmp_path / "run"
    argv = ["train", "--verl-script", str(SCRIPT), "--rank", "0", "--steps", "2", "--preview", "--run-dir", str(run)]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    out = capsys.readouterr().out
    assert "== rank rehearsal (0 of 2)" in out
    assert out.splitlines()[0] == f"verl job: {SCRIPT} (28 keys set)"  # the header `plan` prints
    assert "not modelled: actor_rollout_ref.actor.entropy_from_logits_with_chunking" in out
    # the pre-flight names the job as it was asked for, not by the keys the script sets
    host = next(ln for ln in out.splitlines() if "host RAM: " in ln)
    assert f"host RAM: --verl-script {SCRIPT} (one rank's processes) needs about " in host, host
    cfg = OmegaConf.load(run / "verl_config.yaml")
    assert cfg.trainer.total_training_steps == 2 and list(cfg.trainer.logger) == ["console", "file", "tensorboard"]
    assert cfg.actor_rollout_ref.actor.entropy_from_logits_with_chunking is True  # kept, as written
    _, planned = compose_job(verl_job(read_script(SCRIPT), "every-construct"))
    assert setup_from_config(cfg, planned.arch) == planned


def test_each_committed_run_shows_its_host_pss_and_the_planners_error_per_phase() -> None:
    """Beside the predicted host RAM of an entry's node, each committed run's measured host PSS
    peak (summary.json's peak.host.pss_gib) and the PSS peak predicted for what it ran, a rank
    rehearsal's being its rank's share of the node; in "behind it", the planner's error per phase.
    Both are the figures validation/planner-errors.md gives the same run (its device rows on GPU 0
    and its host row `peak`), so the table and the error table cannot tell two stories."""
    import json

    from verl_recipes.recipe.verl_suite import load_suite
    from verl_recipes.rundir import read_provenance

    errors = (SUITE.parents[1] / "validation" / "planner-errors.md").read_text().splitlines()
    table = (SUITE / "table.md").read_text()
    readme = (SUITE.parents[1] / "README.md").read_text()
    runs = sorted(p.parent for p in (SUITE / "results").glob("*/*/summary.json"))
    assert runs
    suite = load_suite()
    for run in runs:
        entry, name = run.parent.name, f"{run.parent.name}/{run.name}"
        label = f"validation/verl-examples/results/{name}"
        rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in errors if ln.startswith(f"| {label} |")]
        device = [r for r in rows if len(r) == 7 and r[2] == "0"]
        [host] = [r for r in rows if len(r) == 10 and r[1] == "peak"]
        assert device, f"{label}: no device rows in validation/planner-errors.md"
        pss = json.loads((run / "summary.json").read_text())["peak"]["host"]["pss_gib"]
        assert f"{float(pss):.2f}" == host[6]
        rank = read_provenance(run).rank_rehearsal
        share = f"rank {rank.rank} of {rank.world}'s share of the node " if rank else ""
        held = f"{share}{host[7]} predicted"
        want_host = f"{name}: PSS peak {host[6]} measured, {held} ({host[8]})"
        want_errors = "planner's error per phase: " + ", ".join(f"{r[1]} {r[5]}" for r in device)
        # an entry out as written (its run answered why with a --set) is planned as it ran, in
        # both tables, its prediction beside the run's
        for text in (table, readme):
            row = next(ln for ln in text.splitlines() if ln.startswith(f"| [{entry}]("))
            assert not suite[entry].out or "(as run: `--set " in row, row[:300]
            cells = [c.strip() for c in row.split("|")[1:-1]]
            host_cell = next(c for c in cells if "PSS peak" in c)
            assert host_cell.split("<br>")[0].endswith(" predicted"), host_cell
            assert want_host in host_cell.split("<br>"), (want_host, host_cell)
            assert want_errors in row, (want_errors, row)


def test_the_suite_and_rename_tools_refuse_a_folder_or_commit_git_does_not_hold_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "common")}
    repo = tmp_path / "verl"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    cases = [
        ("verl_suite", ["--repo", str(tmp_path / "absent")], "cannot change to"),
        ("verl_renames", ["--repo", str(repo), "--commit", "deadbeef"], "unknown revision"),
    ]
    for module, args, said in cases:
        proc = subprocess.run(
            [sys.executable, "-m", f"verl_recipes.recipe.{module}", *args], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: git -C ") and said in lines[0], proc.stderr


def test_an_unmerged_lora_job_passes_verls_checks_on_a_host_without_vllm() -> None:
    """verl's last start-up check (the LoRA ranks vLLM allows, for an adapter sent unmerged) imports
    `verl.third_party.vllm`, which raises ValueError, not ImportError, where vLLM is absent: the
    Qwen2.5-3B LoRA example's CPU rehearsal was refused as "verl refuses the configuration". The
    checks pass with a note on such a host, and a check verl fails before that one is still its
    refusal in one line."""
    import importlib.util

    from verl_recipes import RecipeError
    from verl_recipes.plan.verl_script import compose_job
    from verl_recipes.recipe.start_checks import verl_validate
    from verl_recipes.recipe.verl_job import verl_job
    from verl_recipes.recipe.verl_suite import entry
    from verl_recipes.workload.arch import resolve_arch
    from verl_recipes.workload.synth import shape_config

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: verl's LoRA-rank check runs whole")
    e = entry("grpo-qwen2-5-3b-gsm8k-grpo-lora")
    cfg, _ = compose_job(verl_job(e.command(), e.name))
    assert cfg.actor_rollout_ref.model.lora_rank == 64 and cfg.actor_rollout_ref.rollout.name == "vllm"
    assert not cfg.actor_rollout_ref.model.get("lora", {}).get("merge", False)  # the check is reached
    note = verl_validate(cfg, shape_config(resolve_arch("qwen2.5-3b")))
    assert note == "verl's LoRA-rank check for vLLM needs vLLM, which this host lacks; a GPU host runs it"
    cfg.actor_rollout_ref.rollout.temperature = 0.0
    cfg.actor_rollout_ref.rollout.val_kwargs.do_sample = True
    cfg.actor_rollout_ref.rollout.val_kwargs.temperature = 0.0
    with pytest.raises(RecipeError, match=r"^verl refuses the configuration at start-up: "):
        verl_validate(cfg, shape_config(resolve_arch("qwen2.5-3b")))
