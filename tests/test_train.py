"""`verl-recipes train` on a CPU host: the preview, and bad input that fails in one line."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from verl_recipes import RecipeError
from verl_recipes.cli import main
from verl_recipes.rundir import Provenance

pytestmark = pytest.mark.skipif(
    subprocess.run(["nvidia-smi", "-L"], capture_output=True, shell=False).returncode == 0
    if os.path.exists("/usr/bin/nvidia-smi")
    else False,
    reason="a GPU host trains instead of previewing",
)


def _fit(cfg: Any, model: Path, gib: float, label: str) -> list[str]:
    """The GPU host's memory verdict on `cfg` for a GPU of `gib` (train's pre-flight, `preflight.fit`)."""
    from verl_recipes.plan.advice import fit_lines as fit
    from verl_recipes.predict.gpus import Budget
    from verl_recipes.predict.inputs import setup_from_config
    from verl_recipes.predict.model import Arch

    return fit(setup_from_config(cfg, Arch.from_file(model / "config.json")), [Budget(f"{gib:.2f}GiB", label)], False)


def test_a_preview_checks_everything_a_cpu_can(root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "VERL_RECIPES_CACHE": str(tmp_path / "cache"), "VERL_RECIPES_ROOT": str(root)}
    proc = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "train", "7b-lora", "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "composed against verl's schema" in out
    assert "parameters loaded in transformers" in out
    assert "rows in verl's RLHFDataset" in out
    assert "training needs an NVIDIA GPU" in out
    assert "verl_recipes.worker.driver --config-path" in out
    cfg = (tmp_path / "run" / "verl_config.yaml").read_text()
    assert "worker_process_setup_hook: verl_recipes.worker.hooks.setup" in cfg
    assert "lora_rank: 64" in cfg
    assert "fits h200-141g" in out and "does not fit a10g-24g" in out  # the pre-flight's plan of this job
    # The folder now holds a run: the same command refuses it; --resume continues it, rewriting nothing.
    files = {f.name: f.read_bytes() for f in (tmp_path / "run").iterdir() if f.is_file()}
    again = [sys.executable, "-m", "verl_recipes.cli", "train", "7b-lora", "--run-dir", str(tmp_path / "run")]
    proc = subprocess.run(again, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: --run-dir"), proc.stderr
    assert "holds a run already" in proc.stderr and proc.stderr.strip().count("\n") == 0
    proc = subprocess.run([*again, "--resume"], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "--resume:" in proc.stdout
    assert {f.name: f.read_bytes() for f in (tmp_path / "run").iterdir() if f.is_file()} == files


def test_bad_model_path_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "7b-lora", "--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --model") and "config.json" in err and "\n" not in err


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`verl-recipes train ...` exits 2 with one error line, which is returned."""
    assert main(["train", *args]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert err.startswith("error: ") and "\n" not in err, cap.out[-2000:] + err
    return err


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of this test's own for the synthetic model and dataset `train` makes."""
    monkeypatch.setenv("VERL_RECIPES_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _user_rows(n: int) -> list[dict[str, object]]:
    from verl_recipes.workload.dataset import make_row

    return [make_row(f"What is {i} + 1?", f"{i} + 1 = {i + 1}", i + 1, "train", i) for i in range(n)]


def test_a_data_folder_without_test_parquet_is_refused_and_left_as_it_was(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's own train.parquet and no test.parquet: nothing is generated into their folder."""
    import pandas as pd

    data = tmp_path / "mine"
    data.mkdir()
    pd.DataFrame(_user_rows(16)).to_parquet(data / "train.parquet", index=False)
    before = (data / "train.parquet").read_bytes()
    err = _refused(["7b-lora", "--data", str(data), "--run-dir", str(tmp_path / "run")], capsys)
    assert f"data.val_files: {data / 'test.parquet'}: no such file" in err
    assert "--set data.val_files=FILE (nothing is written into your folder)" in err
    assert [p.name for p in data.iterdir()] == ["train.parquet"]
    assert (data / "train.parquet").read_bytes() == before
    assert not (tmp_path / "run").exists()
    # What the line says to do works, and still writes nothing into the folder.
    val = tmp_path / "val.parquet"
    pd.DataFrame(_user_rows(4)).to_parquet(val, index=False)
    args = ["7b-lora", "--data", str(data), "--set", f"data.val_files={val}", "--run-dir", str(tmp_path / "run")]
    assert main(["train", *args]) == 0, capsys.readouterr().err[-2000:]
    assert "16 rows in verl's RLHFDataset" in capsys.readouterr().out
    assert [p.name for p in data.iterdir()] == ["train.parquet"] and (data / "train.parquet").read_bytes() == before


def test_a_run_folder_that_holds_a_run_is_refused_and_left_as_it_was(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "finished"
    run.mkdir()
    files = {"command.sh": "#!/usr/bin/env bash\nverl\n", "verl_config.yaml": "data: {}\n", "exit_code": "0\n"}
    for name, text in files.items():
        (run / name).write_text(text)
    err = _refused(["7b-lora", "--run-dir", str(run)], capsys)
    assert "holds a run already (command.sh, verl_config.yaml, exit_code)" in err and "--resume" in err
    assert {p.name: p.read_text() for p in run.iterdir()} == files
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine\n")
    assert "not empty and holds no run" in _refused(["7b-lora", "--run-dir", str(notes)], capsys)
    assert [p.name for p in notes.iterdir()] == ["todo.txt"]


def test_resume_refuses_a_folder_with_nothing_to_continue_and_a_run_of_another_job(
    root: Path, tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--resume never starts a new run silently: no --run-dir, a folder that does not exist or is
    empty, each one line; and a folder of another job (a PPO run, resumed as GRPO) is refused on a
    CPU with the line a GPU host gives, before anything is made or rewritten."""
    err = _refused(["7b-lora", "--preview", "--resume"], capsys)
    assert "--resume continues the run in --run-dir DIR, and none was given" in err
    gone = tmp_path / "typo"
    assert f"--run-dir {gone} does not exist" in _refused(
        ["7b-lora", "--preview", "--resume", "--run-dir", str(gone)], capsys
    )
    assert not gone.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"--run-dir {empty} is empty" in _refused(
        ["7b-lora", "--preview", "--resume", "--run-dir", str(empty)], capsys
    )

    ppo = tmp_path / "ppo"
    ppo.mkdir()
    files = {
        "verl_config.yaml": (root / "recipes/7b-lora/results/h200x1-ppo-packed/verl_config.yaml").read_text(),
        "command.sh": "#!/usr/bin/env bash\nverl\n",
    }
    for name, text in files.items():
        (ppo / name).write_text(text)
    err = _refused(["7b-lora", "--variant", "grpo", "--preview", "--resume", "--run-dir", str(ppo)], capsys)
    assert f"--resume: the job differs from the one in {ppo / 'verl_config.yaml'}" in err
    assert " key(s) differ: actor_rollout_ref." in err and " there, " in err
    assert {p.name: p.read_text() for p in ppo.iterdir()} == files
    assert not (cache / "models").exists()  # refused before the model was made


def test_a_model_folder_with_only_config_json_says_what_is_missing(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_recipes.workload.arch import ARCHS_DIR

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((ARCHS_DIR / "llama-2-7b" / "config.json").read_text())
    err = _refused(["7b-lora", "--model", str(model), "--run-dir", str(tmp_path / "run")], capsys)
    assert "no tokenizer (tokenizer.json, tokenizer.model, vocab.json + merges.txt)" in err
    assert "no weights" in err and f"verl-recipes synth-model --arch {model / 'config.json'} --out" in err
    assert not (tmp_path / "run").exists()


def test_data_without_the_columns_verl_reads_says_which_and_how(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    data = tmp_path / "qa"
    data.mkdir()
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(16)]
    for split in ("train", "test"):
        pd.DataFrame(rows).to_parquet(data / f"{split}.parquet", index=False)
    err = _refused(["7b-lora", "--data", str(data), "--run-dir", str(tmp_path / "run")], capsys)
    assert f"data.train_files: {data / 'train.parquet'}: no column prompt (data.prompt_key" in err
    assert "data_source (read by verl's reward manager)" in err and "reward_model" in err
    assert "columns are answer, question" in err and "verl-recipes dataset --out" in err


def test_cap_needs_a_gpu(tmp_path: Path) -> None:
    from verl_recipes.train import register  # noqa: F401  (the parser is what users reach)

    with pytest.raises(RecipeError, match="--cap-gib needs a GPU"):
        import argparse

        from verl_recipes import train

        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        train.register(sub)
        args = parser.parse_args(["train", "7b-lora", "--cap-gib", "24", "--run-dir", str(tmp_path / "r")])
        train.run(args)


def test_preflight_refuses_a_config_that_cannot_fit(tmp_path: Path) -> None:
    """The planner's verdict gates a GPU launch: one line naming the phase and a knob."""
    from verl_recipes.recipe.compose import compose_recipe
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import launcher_settings
    from verl_recipes.workload.arch import ARCHS_DIR

    recipe = get_recipe("7b-lora")
    model = ARCHS_DIR / "llama-2-7b"
    extra = launcher_settings(recipe, model, tmp_path, tmp_path / "run", 3, 1)
    plain = compose_recipe(recipe, [], [], extra=extra)
    with pytest.raises(RecipeError) as e:
        _fit(plain, model, 24.0, "the --cap-gib budget")
    msg = str(e.value)
    assert "predicted not to fit" in msg and "--set " in msg and "\n" not in msg
    _fit(plain, model, 140.0, "this GPU")  # the uncapped H200 run that worked
    _fit(compose_recipe(recipe, ["24gib"], [], extra=extra), model, 24.0, "the --cap-gib budget")


def test_preflight_warns_when_the_host_has_less_ram_than_the_run_needs(tmp_path: Path) -> None:
    """The 24gib run fits the 24 GiB budget on the GPU; this machine's MemTotal (psutil) against
    the planner's host figure for it is one `WARN host-ram` line, and the launch goes on."""
    import psutil
    from verl_recipes.predict.gpus import Budget
    from verl_recipes.predict.host import plan_host
    from verl_recipes.preflight import preflight

    job = _job("7b-lora", "--variant", "24gib", "--run-dir", str(tmp_path / "run"))
    dry = preflight(job)
    need = plan_host(dry.setup).peak.pss
    assert (
        f"host RAM: 7b-lora --variant 24gib needs about {need / 2**30:.0f} GiB on the GPU host (planner, PSS peak)"
        in dry.lines
    )
    here = dataclasses.replace(job, preview=None, budgets=(Budget("24.00GiB", "the --cap-gib budget"),))
    out = "\n".join(preflight(here).lines)
    total = psutil.virtual_memory().total
    warned = [x for x in out.splitlines() if x.startswith("WARN host-ram")]
    if total < need:
        assert warned == [
            f"WARN host-ram {total / 2**30:.1f} GiB total; 7b-lora --variant 24gib needs about "
            f"{need / 2**30:.0f} GiB (planner, PSS peak; see verl-recipes plan)"
        ]
    elif total >= need / 0.9:
        assert not warned
    assert "plan: fits the --cap-gib budget" in out


def test_gpus_makes_a_multi_node_recipe_a_one_node_run(root: Path, tmp_path: Path) -> None:
    """`--gpus 2 --layers 2` on the 32-GPU 70b-3d recipe (a truncated run on two GPUs) composes a
    one-node, two-GPU config instead of keeping the recipe's 4 nodes."""
    from omegaconf import OmegaConf

    env = {**os.environ, "VERL_RECIPES_CACHE": str(tmp_path / "cache"), "VERL_RECIPES_ROOT": str(root)}
    sets = [
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1",
        "critic.megatron.tensor_model_parallel_size=2",
        "critic.megatron.pipeline_model_parallel_size=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    ]
    cmd = [sys.executable, "-m", "verl_recipes.cli", "train", "70b-3d", "--gpus", "2", "--layers", "2", "--preview"]
    cmd += [x for s in sets for x in ("--set", s)] + ["--run-dir", str(tmp_path / "run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    cfg = OmegaConf.load(tmp_path / "run" / "verl_config.yaml")
    assert cfg.trainer.nnodes == 1 and cfg.trainer.n_gpus_per_node == 2
    assert cfg.critic.megatron.override_transformer_config.attention_backend == "fused"


PPO_64 = [
    "--set",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.95",
    "--set",
    "data.train_batch_size=64",
    "--set",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "--set",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
]


def test_the_preview_refuses_what_a_gpu_host_refuses_with_the_same_line(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The preview checks the job asked for, --set included, not the stock recipe: a batch of 64
    micro-batches of 64 with vLLM at 95% of the GPU fits no GPU; the GPU host's check
    (`preflight.fit` with its GPU's memory) refuses it with the same reason."""
    from verl_recipes.predict.gpus import GIB, parse_gpu
    from verl_recipes.recipe.compose import compose_recipe
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import launcher_settings
    from verl_recipes.workload.arch import ARCHS_DIR

    err = _refused(["7b-lora", "--run-dir", str(tmp_path / "run"), *PPO_64], capsys)
    assert err.startswith("error: predicted not to fit even the largest GPU the planner knows, h200-141g (140.4 GiB): ")
    assert not (tmp_path / "run").exists()  # nothing half-runs
    recipe = get_recipe("7b-lora")
    extra = launcher_settings(recipe, ARCHS_DIR / "llama-2-7b", tmp_path, tmp_path / "run", 3, 1)
    cfg = compose_recipe(recipe, [], PPO_64[1::2], extra=extra)
    with pytest.raises(RecipeError) as e:
        _fit(cfg, ARCHS_DIR / "llama-2-7b", parse_gpu("h200-141g").visible_bytes / GIB, "this GPU")
    assert str(e.value).startswith("predicted not to fit this GPU (140.4 GiB): ")
    assert str(e.value).split(" GiB): ", 1)[1] == err.split(" GiB): ", 1)[1]


def test_the_preview_plans_the_gpu_and_layout_asked_for(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--gpu` names the GPU a preview is for; `--gpus` the GPUs the layout must divide over; `--arch`
    the model the plan uses. Each is refused where a GPU host would refuse it."""
    run = str(tmp_path / "run")
    err = _refused(["7b-lora", "--run-dir", run, "--gpu", "a10g-24g"], capsys)
    assert err.startswith("error: predicted not to fit a10g-24g (22.5 GiB): ") and "--set " in err
    # the whole fix, every knob of the planner's path at once (`plan.advice.whole_fix`), never one of several
    from verl_recipes.plan.advice import whole_fix
    from verl_recipes.predict.gpus import parse_gpu
    from verl_recipes.preflight import preflight

    setup = preflight(_job("7b-lora", "--run-dir", str(tmp_path / "other"))).setup
    assert f"; {whole_fix(setup, parse_gpu('a10g-24g'))} (`verl-recipes plan` explains" in err
    assert "; to fit on 1 GPU(s): " in err and "host RAM about" in err
    err = _refused(["70b-3d", "--run-dir", run, "--gpus", "2", "--layers", "2"], capsys)
    assert err == (
        "error: 2 GPUs (1 nodes x 2) do not divide by the rollout's TP x DP x PP = 4 x 1 x 1 = 4; "
        "change them, trainer.nnodes or trainer.n_gpus_per_node"
    )
    err = _refused(["7b-lora", "--run-dir", run, "--arch", "llama-2-70b"], capsys)
    assert "predicted not to fit even the largest GPU the planner knows" in err
    assert not (tmp_path / "run").exists()


def _job(*argv: str) -> Any:
    """The `Job` `verl-recipes train ARGV` decides on this host (`job.decide`), through train's parser."""
    import argparse

    from verl_recipes import train
    from verl_recipes.job import decide

    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    return decide(parser.parse_args(["train", *argv]))


def test_a_rank_rehearsal_states_one_ranks_host_ram(tmp_path: Path) -> None:
    """`train --rank` runs one rank's processes on its host: the pre-flight states that rank's share
    (`plan_host(..., ranks_here=1)`), which for 13b-fsdp's offloaded 40gib variant is well under the
    two-rank node's figure (each rank pins its own shards of the weights and optimizer states)."""
    from verl_recipes.predict.host import plan_host
    from verl_recipes.predict.inputs import setup_from_config
    from verl_recipes.predict.model import Arch
    from verl_recipes.preflight import preflight

    job = _job("13b-fsdp", "--variant", "40gib", "--rank", "0", "--run-dir", str(tmp_path / "run"))
    checked = preflight(job)
    cfg, verdict = checked.cfg, checked.lines
    arch, source = job.model.config()
    setup = setup_from_config(cfg, Arch.from_config(arch, source))
    one, node = plan_host(setup, ranks_here=1).peak.pss, plan_host(setup).peak.pss
    assert node - one > 40 * 2**30
    line = f"host RAM: 13b-fsdp --variant 40gib (one rank's processes) needs about {one / 2**30:.0f} GiB"
    assert any(x.startswith(line) for x in verdict), verdict


def test_the_host_ram_of_the_job_is_judged_once_in_the_preflight(tmp_path: Path) -> None:
    """The pre-flight judges the host RAM of the job the command line names (its variants, in its
    label), not the stock recipe: on a CPU host it states the planner's figure for the GPU host;
    on the host that trains, a machine with less is one `WARN host-ram` line naming the job."""
    import psutil
    from verl_recipes.predict.host import host_lines, plan_host
    from verl_recipes.predict.inputs import setup_from_config
    from verl_recipes.predict.model import Arch
    from verl_recipes.preflight import preflight

    job = _job("7b-lora", "--variant", "grpo", "--variant", "24gib", "--run-dir", str(tmp_path / "run"))
    label = "7b-lora --variant grpo --variant 24gib"
    checked = preflight(job)
    arch, source = job.model.config()
    need = plan_host(setup_from_config(checked.cfg, Arch.from_config(arch, source))).peak.pss
    assert f"host RAM: {label} needs about {need / 2**30:.0f} GiB on the GPU host (planner, PSS peak)" in checked.lines
    here = host_lines(checked.setup, label, (), None, here=True)
    warned = [x for x in here if x.startswith("WARN host-ram")]
    total = psutil.virtual_memory().total
    if total < need:
        assert warned == [
            f"WARN host-ram {total / 2**30:.1f} GiB total; {label} needs about "
            f"{need / 2**30:.0f} GiB (planner, PSS peak; see verl-recipes plan)"
        ]
    else:
        assert not warned
    assert not (tmp_path / "run").exists()  # decided and judged; nothing written


def test_a_preview_of_a_rank_rehearsal_on_a_cpu_plans_the_whole_jobs_rank(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train 13b-fsdp --rank 0` on a CPU: the job is the recipe's real two-GPU job (its config
    says so), the preview says which rank a GPU host runs, and command.sh starts the trainer
    with the rank's variable, so the same command on a one-GPU host runs rank 0 of 2."""
    import shlex

    from omegaconf import OmegaConf
    from verl_recipes.layout import ENV_RANK

    run = tmp_path / "run"
    assert main(["train", "13b-fsdp", "--rank", "0", "--run-dir", str(run)]) == 0, capsys.readouterr().err[-2000:]
    out = capsys.readouterr().out
    assert f"== rank rehearsal (0 of 2): a GPU host runs this job's rank 0 on one GPU ({ENV_RANK}=0/2)" in out
    assert "   rank: rank rehearsal (0 of 2); the plan below is one GPU's share of the job" in out
    assert "training needs an NVIDIA GPU (one GPU, for rank rehearsal (0 of 2))" in out
    cfg = OmegaConf.load(run / "verl_config.yaml")
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 2)
    command = (run / "command.sh").read_text().splitlines()[-1]
    assert shlex.split(command)[:4] == [f"{ENV_RANK}=0/2", sys.executable, "-m", "verl_recipes.worker.driver"]
    assert f"   {command}" in out  # the command a GPU host runs, as the preview prints it


def test_a_rank_outside_the_jobs_world_is_refused_in_one_line(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    err = _refused(["13b-fsdp", "--rank", "2", "--run-dir", str(run)], capsys)
    assert err == "error: --rank 2 is not a rank of this job's 2 GPU(s): use 0 to 1"
    err = _refused(["13b-fsdp", "--rank", "0", "--set", "trainer.n_gpus_per_node=4", "--run-dir", str(run)], capsys)
    assert err == (
        "error: --rank 0: the composed job has 4 GPU(s), its layout 2; set the GPUs per node with --gpus, "
        "not --set trainer.*"
    )
    assert not run.exists()


def test_the_rank_names_the_run_folder_its_environment_and_its_provenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The world is the job's GPUs after --gpus (GPUs per node); the rank goes into the default run
    folder's name, the environment every process of the run inherits, and provenance.json."""
    from verl_recipes.layout import ENV_RANK, RankSpec
    from verl_recipes.preflight import preflight
    from verl_recipes.train import launch_env, run_record, trainer_command

    monkeypatch.chdir(tmp_path)
    job = _job("13b-fsdp", "--rank", "3", "--gpus", "4")
    assert job.rank == RankSpec(3, 4) and job.layout.world == 4
    # a preview on this CPU host, named for the recipe's 40 GiB card (an A100): runs/<recipe>/<name>
    assert (
        job.run_dir
        == tmp_path / "runs" / "13b-fsdp" / "a100x1-ppo-rank3of4-preview"
        == tmp_path / "runs" / "13b-fsdp" / job.name.text
    )
    assert launch_env(job, {})[ENV_RANK] == "3/4"
    cfg = preflight(job).cfg
    rec = run_record(job, cfg, trainer_command(job), {}, None)
    assert rec["rank_rehearsal"] == {"rank": 3, "world": 4, "pools": "rank share"}
    assert Provenance.from_record(rec).rank_pools_shared  # the host model reads it back
    whole = _job("13b-fsdp", "--run-dir", str(tmp_path / "whole"))
    assert whole.rank is None and ENV_RANK not in launch_env(whole, {})
    assert run_record(whole, cfg, trainer_command(whole), {}, None)["rank_rehearsal"] is None
    # decided and judged: a named run folder is claimed (a lock file beside it), never made; the
    # default one is made empty, and the same job again is the configuration's repeat
    assert not any(job.run_dir.iterdir()) and not (tmp_path / "whole").exists()
    assert _job("13b-fsdp", "--rank", "3", "--gpus", "4").run_dir.name == "a100x1-ppo-rank3of4-preview-2"


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--steps", "0", "0 is below 1"),
        ("--gpus", "-1", "-1 is below 1"),
        ("--layers", "0", "0 is below 1"),
        ("--cap-gib", "0", "0 is not above 0"),
        ("--rank", "-1", "-1 is below 0"),
    ],
)
def test_a_count_or_size_of_nothing_is_one_error_line(
    tmp_path: Path, option: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--steps 0` would train nothing and `--cap-gib 0` cap to nothing: refused by the parser, in one
    line, before the run folder is claimed."""
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["train", "7b-lora", option, value, "--run-dir", str(run)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and f"argument {option}: {says}" in err, err
    assert not any(tmp_path.iterdir())


def test_a_preview_of_a_job_too_large_for_its_gpu_ends_naming_the_variant_that_fits(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train 13b-fsdp` as written needs about 70 GiB a GPU; its recipe targets 40 GiB. The plan
    above says it does not fit there, and the closing line agrees: it names `--variant 40gib`,
    never "run the same command"."""
    assert main(["train", "13b-fsdp", "--run-dir", str(tmp_path / "run")]) == 0, capsys.readouterr().err[-2000:]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("training needs an NVIDIA GPU (2 x 40GiB); this host has 0 NVIDIA GPU(s)"), last
    assert "does not fit 40GiB; --variant 40gib does (peak " in last and "preview and train with it" in last
    assert "run the same command" not in last
    assert not (tmp_path / "run" / "incomplete.json").exists()  # the preview is done: the folder is complete


def test_a_cached_dataset_cut_short_is_made_again(tmp_path: Path, cache: Path) -> None:
    """A cache entry with both parquet files, one of them cut short by a writer that was killed, is
    not whole (`dataset.complete`): `train` makes the dataset again instead of handing verl half."""
    from verl_recipes.train import ensure_dataset
    from verl_recipes.workload import dataset

    job = _job("7b-lora", "--run-dir", str(tmp_path / "run"))
    dataset.write(job.data, 64, 8)
    raw = (job.data / "train.parquet").read_bytes()
    (job.data / "train.parquet").write_bytes(raw[: len(raw) // 2])
    assert not dataset.complete(job.data)
    assert ensure_dataset(job) == job.data
    assert dataset.complete(job.data)
    import pyarrow.parquet as pq

    assert pq.read_metadata(job.data / "train.parquet").num_rows == 4096  # the command's own default


def test_a_megatron_rank_on_a_gpu_host_trains_from_a_checkpoint_without_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a host with one GPU (this CPU host says it has one H200 here: the GPU count is the
    only thing stood in for), `train 70b-3d --rank 16` makes its synthetic checkpoint without
    weights (80 layers of 70B would be 138 GB), in a cache folder of its own; an FSDP rank and
    the whole Megatron job keep theirs."""
    from verl_recipes import job as job_module

    monkeypatch.setattr(job_module, "local_gpus", lambda: (1, 140.4, "h200"))
    rank = _job("70b-3d", "--rank", "16", "--run-dir", str(tmp_path / "a"))
    assert rank.preview is None and rank.model.device == "cuda"
    assert rank.model.weights is False and rank.model.path.name == "llama-2-70b-full-width-Lall-noweights"
    fsdp = _job("13b-fsdp", "--rank", "0", "--run-dir", str(tmp_path / "b"))
    assert fsdp.model.weights is True and not fsdp.model.path.name.endswith("-noweights")
    monkeypatch.setattr(job_module, "local_gpus", lambda: (8, 140.4, "h200"))
    whole = _job("70b-3d", "--gpus", "8", "--layers", "2", "--run-dir", str(tmp_path / "c"))
    assert whole.model.weights is True
    assert [j.gpu_checkpoint_weights for j in (rank, fsdp, whole)] == [False, True, True]
    # a GPU host names each run by the rule, on its own GPU family (recipe/run_names.py)
    assert [j.name.text for j in (rank, fsdp, whole)] == [
        "h200x1-ppo-rank16of32",
        "h200x1-ppo-rank0of2",
        "h200x8-ppo-l2",
    ]


def test_a_cpu_preview_of_a_megatron_rank_judges_the_disk_of_the_gpu_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU the rank's tiny stand-in has weights, but the disk check judges the GPU run, whose
    checkpoint has none: the floor, not three copies of 70B (the GPU host's own verdict)."""
    from verl_recipes import job as job_module
    from verl_recipes.stack import verify

    monkeypatch.setattr(job_module, "local_gpus", lambda: (0, 0.0, ""))
    rank = _job("70b-3d", "--rank", "0", "--run-dir", str(tmp_path / "a"))
    assert rank.preview and rank.model.weights is True and rank.gpu_checkpoint_weights is False
    assert verify.disk_need(rank.recipe, rank.gpu_checkpoint_weights) == (20.0, "the run's logs, samples and caches")
    whole = _job("70b-3d", "--run-dir", str(tmp_path / "b"))
    need, what = verify.disk_need(whole.recipe, whole.gpu_checkpoint_weights)
    assert round(need) == 385 and what == "the model and checkpoints"


def test_preflight_judges_70b_as_plan_does_with_the_recipes_calibrated_prediction(tmp_path: Path) -> None:
    """One verdict per job and GPU: 70b-3d's committed calibrated prediction for 32 80 GB cards
    (its ranks 16 and 0 rehearsed at that layout: 79.23 GiB in update_actor) is tight, as `plan`
    says, and runs; the same recipe with that prediction over the card (the TP1 depth fit's 85.8
    GiB in update_critic, which the rank rehearsal replaced) is refused with `plan`'s fix, although
    the planner alone puts the peak at 78.8 GiB."""
    import shutil

    import yaml
    from verl_recipes import RecipeError
    from verl_recipes.plan.advice import fit_lines as fit
    from verl_recipes.predict.gpus import Budget
    from verl_recipes.predict.setup import load_setup

    _, setup, recipe = load_setup("70b-3d", [], [])
    h100 = [Budget("h100-80g", "h100-80g")]
    assert fit(setup, h100, False)[0].startswith("plan: tight (under the card by 0.8 GiB, less than the 3.7 GiB")
    assert fit(setup, h100, False)[0].endswith("on h100-80g: peak update_actor 78.8 GiB")
    cal = fit(setup, h100, False, recipe=recipe)[0]
    assert cal.startswith("plan: tight (under the card by 0.4 GiB") and "update_actor 79.2 GiB" in cal
    over = tmp_path / "70b-3d"
    shutil.copytree(recipe.dir / "expected", over / "expected")
    doc = yaml.safe_load((over / "expected" / "h100x32-ppo.yaml").read_text())
    doc["predicted_gib"]["update_critic"], doc["fits"] = 85.83, False
    (over / "expected" / "h100x32-ppo.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(RecipeError) as e:
        fit(setup, h100, False, recipe=recipe.model_copy(update={"dir": over}))
    msg = str(e.value)
    assert "\n" not in msg and "the calibrated prediction puts update_critic at 85.8 GiB" in msg
    assert "--set trainer.nnodes=8" in msg
    h200 = fit(setup, [Budget("h200-141g", "h200-141g")], False, recipe=recipe)
    assert h200 == ["plan: fits h200-141g: peak update_actor 78.8 GiB"]
