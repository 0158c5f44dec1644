"""verl_recipes.peers: one workload, three sides composed from it, each peer's own parser, the marks.

verl's side is composed against verl's Hydra config, TRL's command line parsed by TRL 1.16.0's own
GRPO script parser and OpenRLHF's by the `__main__` block of its own train_ppo_ray.py (both
downloaded from PyPI, without dependencies, and skipped without it; nothing is installed into the
test environment). The marks run under the real monitor and report; the peers' GPU runs are the
campaign's (gpu/campaigns/peers.txt).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from verl_recipes import RecipeError
from verl_recipes.measure.report import write_report
from verl_recipes.paths import repo_root
from verl_recipes.peers import compose, openrlhf, rewards, run_openrlhf, table, trl
from verl_recipes.peers.workload import BATCHES, LINEAR, Paths, verl_train_args, workload
from verl_recipes.rundir import write_provenance

ROOT = repo_root()
PATHS = Paths(model="/m", data="/run/data", out="/run/out")


def _download(name: str, version: str, dest: Path) -> Path:
    """The peer's own wheel, without its dependencies, unpacked into `dest`."""
    dl = dest / "dl"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
    cmd += ["--python-version", "3.12", "-d", str(dl), f"{name}=={version}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = dl.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest / "site")
    return dest / "site"


@pytest.fixture(scope="session")
def trl_site(pypi: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _download("trl", trl.VERSION, tmp_path_factory.mktemp("trl"))


@pytest.fixture(scope="session")
def openrlhf_package(pypi: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = _download("openrlhf", openrlhf.VERSION, tmp_path_factory.mktemp("openrlhf"))
    (pkg,) = site.glob("openrlhf-*.data/purelib/openrlhf")
    return pkg


def _flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            out[a] = nxt
    return out


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_every_side_runs_the_same_workload(batch: str, tmp_path: Path) -> None:
    """The one workload, read back from each side's composed configuration: verl's through verl's
    own config, TRL's and OpenRLHF's from their command lines."""
    from verl_recipes import train
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import compose_run, gpu_layout

    w = workload(batch)
    b = w.batch
    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    args = parser.parse_args(["train", *verl_train_args(w)])
    recipe = get_recipe(args.recipe)
    layout = gpu_layout(recipe, 1, False)
    cfg = compose_run(
        recipe, args.variant, args.sets, layout, model=Path("/m"), data=Path("/d"), run_dir=tmp_path, steps=args.steps
    )
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (cfg.data.train_batch_size, r.n, cfg.data.max_response_length) == (
        b.prompts,
        b.answers,
        b.max_response_tokens,
    )
    assert (r.temperature, r.top_p, r.top_k) == (w.temperature, w.top_p, -1)
    assert (cfg.actor_rollout_ref.model.lora_rank, cfg.actor_rollout_ref.model.lora_alpha) == (
        w.lora_rank,
        w.lora_alpha,
    )
    assert (a.kl_loss_coef, a.kl_loss_type, a.clip_ratio, a.optim.lr) == (
        w.kl_coef,
        "low_var_kl",
        w.clip,
        w.learning_rate,
    )
    assert a.ppo_mini_batch_size == b.prompts and a.ppo_micro_batch_size_per_gpu == b.micro_batch
    assert cfg.trainer.total_training_steps == b.steps and cfg.algorithm.adv_estimator == "grpo"

    t = _flags(trl.argv(w, "docs", PATHS))
    assert (t["--num_generations"], t["--max_completion_length"], t["--max_steps"]) == tuple(
        str(x) for x in (b.answers, b.max_response_tokens, b.steps)
    )
    assert int(t["--per_device_train_batch_size"] or 0) * int(t["--gradient_accumulation_steps"] or 0) == b.sequences
    assert (t["--temperature"], t["--top_p"], t["--top_k"], t["--beta"]) == ("1.0", "1.0", "0", str(w.kl_coef))
    assert (t["--lora_r"], t["--lora_alpha"], t["--learning_rate"]) == ("64", "128", str(w.learning_rate))

    argv = openrlhf.argv(w, "docs", PATHS, "/r.py")
    o = _flags(argv)
    assert (o["--rollout.batch_size"], o["--rollout.n_samples_per_prompt"], o["--train.batch_size"]) == tuple(
        str(x) for x in (b.prompts, b.answers, b.sequences)
    )
    assert (o["--rollout.max_new_tokens"], o["--data.max_samples"]) == (
        str(b.max_response_tokens),
        str(b.steps * b.prompts),
    )
    assert (o["--algo.kl.init_coef"], o["--algo.kl.estimator"], o["--actor.eps_clip"]) == ("0.001", "k3", "0.2")
    i = argv.index("--ds.lora.target_modules")
    assert tuple(argv[i + 1 : i + 1 + len(LINEAR)]) == LINEAR


def test_trl_1_16_0s_own_script_parses_every_row(trl_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's `trl grpo` parser (GRPOScriptArguments, GRPOConfig, ModelConfig) takes each row and
    runs its own checks; `--use_cpu` only because Transformers refuses bf16 on a machine without a
    GPU. The launcher's wrap targets exist in this TRL."""
    monkeypatch.syspath_prepend(str(trl_site))
    grpo = importlib.import_module("trl.scripts.grpo")
    for batch in BATCHES:
        w = workload(batch)
        for row in ("docs", "tuned"):
            script, cfg, model, _ = grpo.make_parser().parse_args_and_config(
                [*trl.argv(w, row, PATHS), "--use_cpu", "true"]
            )
            assert cfg.generation_batch_size == w.batch.sequences and cfg.num_generations == w.batch.answers
            assert (cfg.use_vllm, cfg.vllm_mode, cfg.vllm_max_model_length) == (True, "colocate", w.max_model_len)
            assert cfg.vllm_enable_sleep_mode is (row == "tuned")
            assert (model.use_peft, model.lora_r, model.lora_target_modules) == (True, 64, "all-linear")
            assert script.reward_funcs == [trl.REWARD] and cfg.max_steps == w.batch.steps
    with pytest.raises(ValueError, match="--no_such_flag"):
        grpo.make_parser().parse_args_and_config(["--no_such_flag", "1", "--output_dir", "/x", "--use_cpu", "true"])
    gen = importlib.import_module("trl.generation.vllm_generation").VLLMGeneration
    trainer = importlib.import_module("trl.trainer.grpo_trainer").GRPOTrainer
    for owner, attr in ((gen, "generate"), (gen, "sync_weights"), (trainer, "_generate_and_score_completions")):
        assert callable(getattr(owner, attr)), attr
    assert callable(trainer.training_step)


def test_openrlhf_0_11_2s_own_parser_takes_every_row(openrlhf_package: Path) -> None:
    """The `__main__` block of OpenRLHF's train_ppo_ray.py, its argparse definitions and checks,
    run on each row; a flag it does not know is its own error."""
    for batch in BATCHES:
        w = workload(batch)
        for row in openrlhf.ROWS:
            ns = openrlhf.parse_args(openrlhf_package, openrlhf.argv(w, row, PATHS, "/r.py"))
            assert ns.algo.advantage.estimator == "group_norm" and ns.critic.model_name_or_path is None
            assert (ns.rollout.batch_size, ns.rollout.n_samples_per_prompt) == (w.batch.prompts, w.batch.answers)
            assert ns.ds.lora.rank == (0 if row == "full" else 64) and ns.ds.adam_offload is (row == "full")
            assert ns.ds.zero_stage == (2 if row == "tuned" else 3) and ns.vllm.enforce_eager is (row != "tuned")
            assert ns.ds.attn_implementation == "sdpa" and not ns.ds.packing_samples
    with pytest.raises(RecipeError, match=r"unrecognized arguments: --ds\.zero_stagex"):
        openrlhf.parse_args(openrlhf_package, ["--ds.zero_stagex", "3"])
    # what the launcher wraps is in this OpenRLHF (its modules import Ray and vLLM: read, not imported)
    import ast

    wrapped = {
        "trainer/ppo_utils/samples_generator.py": ("SamplesGenerator", "generate_samples"),
        "trainer/ppo_utils/experience_maker.py": ("RemoteExperienceMaker", "make_experience_batch"),
        "trainer/ppo_trainer.py": ("BasePPOTrainer", "train_step", "ppo_train", "broadcast_to_vllm"),
        "utils/deepspeed/deepspeed.py": ("DeepspeedStrategy", "get_ds_train_config"),
    }
    for path, (cls, *methods) in wrapped.items():
        tree = ast.parse((openrlhf_package / path).read_text())
        (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        have = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
        assert set(methods) <= have, f"{path}: {cls} lacks {set(methods) - have}"


def test_openrlhf_imports_its_flash_attn_names_from_the_stand_in(openrlhf_package: Path) -> None:
    """OpenRLHF's ring_attn_utils.py imports flash-attn's padding helpers at load: with the stand-in
    it loads, Transformers sees no flash-attn, a helper called says what to leave off, and
    flash-attn's Triton ops stay absent (OpenRLHF's log-prob fallback)."""
    from transformers.utils.import_utils import _is_package_available

    before = {k for k in sys.modules if k.startswith("flash_attn")}
    try:
        run_openrlhf.stand_in_flash_attn()
        spec = importlib.util.spec_from_file_location("ring", openrlhf_package / "models" / "ring_attn_utils.py")
        assert spec is not None and spec.loader is not None
        ring = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ring)
        assert _is_package_available("flash_attn", return_version=True)[0] is False
        with pytest.raises(RuntimeError, match=r"--ds\.packing_samples"):
            ring.pad_input(None, None, 1, 1)
        with pytest.raises(ImportError):
            importlib.import_module("flash_attn.ops.triton.cross_entropy")
    finally:
        for k in [k for k in sys.modules if k.startswith("flash_attn") and k not in before]:
            del sys.modules[k]


def test_deepspeed_gets_torchs_adamw_only_where_nothing_can_compile_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.cpp_extension as ext

    def config() -> dict[str, Any]:
        return {"optimizer": {"type": "AdamW", "params": {"lr": 1e-6}}, "zero_optimization": {"stage": 3}}

    monkeypatch.setattr(ext, "CUDA_HOME", None)
    got = run_openrlhf.torch_adam_config(config())
    assert (
        got["optimizer"]["params"] == {"lr": 1e-6, "torch_adam": True} and got["zero_force_ds_cpu_optimizer"] is False
    )
    assert run_openrlhf.torch_adam_config({"zero_optimization": {}}) == {"zero_optimization": {}}
    monkeypatch.setattr(ext, "CUDA_HOME", "/usr/local/cuda")
    assert run_openrlhf.torch_adam_config(config()) == config()


def test_the_reward_scores_the_answer_alike_for_every_side() -> None:
    prompt = "<|im_start|>user\nAna has 2 apples and buys 40 more. 12?<|im_end|>\n<|im_start|>assistant\n"
    assert rewards.trl_reward(["so #### 42", [{"role": "assistant", "content": "#### 41"}]], ["42", "42"]) == [1.0, 0.0]
    assert rewards.answer_of(prompt + "it is 7", prompt) == "it is 7"
    got = rewards.reward_func([prompt + "#### 42", prompt + "no number"], [prompt, prompt], ["42", "12"])
    assert got["rewards"].tolist() == [1.0, 0.0] and got["scores"].tolist() == [1.0, 0.0]


def test_the_peers_read_the_recipes_prompts_in_order_with_its_template(tmp_path: Path) -> None:
    from verl_recipes.peers import data
    from verl_recipes.workload import dataset, synth

    dataset.write(tmp_path / "d", 6, 2)
    synth.synthesize("llama-2-7b", tmp_path / "m", scale="tiny", device="cpu", weights=False)
    rows = data.render(data.rows(tmp_path / "d" / "train.parquet"), tmp_path / "m")
    import pandas as pd

    src = pd.read_parquet(tmp_path / "d" / "train.parquet")
    assert [r["ground_truth"] for r in rows] == [str(x["ground_truth"]) for x in src["reward_model"]]
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["prompt_text"].endswith("<|im_start|>assistant\n")
    path = data.write(rows, tmp_path / "out")
    assert [json.loads(x) for x in path.read_text().splitlines()] == rows


MARKED = """
import time
from verl_recipes.peers import marks
steps = marks.Steps(gpus=1)
gen = marks.phase("gen", steps)(lambda: time.sleep(0.3))
update = marks.phase("update_actor", steps)(lambda: time.sleep(0.2))
for _ in range(3):
    steps.begin()
    gen()
    steps.add_tokens(1000)
    update()
    steps.end()
"""


def test_a_marked_loop_under_the_monitor_reports_and_tabulates(tmp_path: Path) -> None:
    """A loop marked as the launchers mark a peer, under the real monitor: the report reads its
    steps, phases and rate as a verl run's, and the table makes its row."""
    run = tmp_path / "run"
    script = tmp_path / "loop.py"
    script.write_text(MARKED)
    env = {"PYTHONPATH": str(ROOT / "common"), "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "verl_recipes.cli"]
    r = subprocess.run([*cli, "monitor", "--out", str(run), "--", sys.executable, str(script)], env=env, timeout=120)
    assert r.returncode == 0
    write_provenance(run, {"backend": "trl", "world": 1, "adv_estimator": "grpo", "peer": {"row": "docs"}})
    write_report(run)
    f = table.figures(run)
    assert f.side == "trl" and f.steps == 3 and f.status == "finished"
    assert f.step_s is not None and 0.5 <= f.step_s < 2.0
    assert f.tokens_s is not None and abs(f.tokens_s - 1000 / f.step_s) < 1
    metrics = [json.loads(x)["metrics"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(abs(m["timing_s/gen"] - 0.3) < 0.1 and abs(m["timing_s/update_actor"] - 0.2) < 0.1 for m in metrics)
    line = table.render([run]).splitlines()[-1]
    assert line.startswith("| trl | docs | ") and "[run](" in line


def test_the_comparison_names_composed_sides_and_says_not_yet_measured() -> None:
    doc = table.load_index()
    composed = {(s.side, s.row) for batch in BATCHES for s in compose.sides(batch)}
    for batch, spec in doc["batches"].items():
        assert batch in BATCHES
        for r in spec["rows"]:
            assert (r["peer"], r["row"]) in composed, r
            if r["run"] is None:
                continue
            prov = json.loads((ROOT / "recipes" / "7b-lora" / "results" / r["run"] / "provenance.json").read_text())
            assert prov.get("backend", "verl") == r["peer"] if r["peer"] != "verl" else "backend" not in prov
    assert table.tables().count(table.NOT_MEASURED) == sum(
        1 for spec in doc["batches"].values() for r in spec["rows"] if r["run"] is None
    )


def _campaign_lines(name: str) -> list[list[str]]:
    lines = (ROOT / "gpu" / "campaigns" / name).read_text().splitlines()
    return [shlex.split(x.split("|")[3]) for x in lines if x.strip() and not x.startswith("#")]


@pytest.mark.parametrize(("campaign", "batch"), [("peers.txt", "8x8"), ("peers-prod.txt", "prod")])
def test_the_peers_campaigns_run_what_the_workload_composes(campaign: str, batch: str, tmp_path: Path) -> None:
    """verl's line is the workload's `train` arguments; each peer line composes (`peers run
    --dry-run`), in the peer's own environment: this checkout's common/ and the peer's site."""
    from verl_recipes.cli import main

    lines = _campaign_lines(campaign)
    assert lines[0] == verl_train_args(workload(batch))
    for words in lines[1:]:
        assert words[:2] == ["bash", "gpu/peers.sh"]
        peer, b, row = words[2:5]
        assert b == batch
        out = tmp_path / f"{peer}-{row}"
        argv = ["peers", "run", peer, "--run-dir", str(out), "--batch", b, "--row", row, "--site", "/s", "--dry-run"]
        assert main(argv) == 0
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("")
    assert main(["peers", "run", "trl", "--run-dir", str(used), "--dry-run"]) == 2  # never rewrites a run


def test_peers_run_gives_the_launcher_the_peers_environment_not_ours(capsys: pytest.CaptureFixture[str]) -> None:
    from verl_recipes.cli import main

    assert (
        main(["peers", "run", "openrlhf", "--run-dir", "/tmp/none-x", "--row", "full", "--site", "/s", "--dry-run"])
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    cmd = got["command"]
    assert f"PYTHONPATH={ROOT / 'common'}:/s" in cmd
    assert cmd[-3:] == ["-m", "verl_recipes.peers.run_openrlhf", "/tmp/none-x"]
    assert "--ds.adam_offload" in got["spec"]["argv"] and got["spec"]["argv"].count("--ds.lora.rank") == 0
    assert main(["peers", "run", "trl", "--run-dir", "/tmp/none-x", "--row", "full", "--dry-run"]) == 2


def test_the_peers_page_is_the_composed_configurations() -> None:
    page = (ROOT / "recipes" / "7b-lora" / "comparisons" / "peers.md").read_text()
    assert page == compose.markdown()
    for s in compose.sides("8x8"):
        assert shlex.join(s.command) in page
    assert trl.DOCS_VLLM in page and openrlhf.DOCS in page and openrlhf.LORA_SYNC_ISSUE in page


def test_the_workload_refuses_a_batch_it_does_not_have() -> None:
    with pytest.raises(RecipeError, match="choose one of 8x8, prod"):
        workload("16x16")
    ks = yaml.safe_load((ROOT / "recipes" / "7b-lora" / "comparisons" / "peers.yaml").read_text())
    assert set(ks["batches"]) == set(BATCHES)


def test_verl_vs_deepspeed_gives_openrlhf_its_workload(openrlhf_package: Path, tmp_path: Path) -> None:
    """compare.py openrlhf-args: recipe verl-vs-deepspeed's PPO workload with verl's constants, as
    OpenRLHF's own parser takes it (a critic, every weight trained, one answer a prompt)."""
    out = tmp_path / "args.json"
    cmd = [sys.executable, str(ROOT / "recipes" / "verl-vs-deepspeed" / "compare.py"), "openrlhf-args"]
    cmd += ["--model", "/m", "--data", "/d.parquet", "--batch", "32", "--mini-batch", "8", "--gpus", "1"]
    cmd += ["--run-dir", str(tmp_path / "run"), "--out", str(out)]
    r = subprocess.run(
        cmd, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "common"), "PATH": "/usr/bin:/bin"}
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    ns = openrlhf.parse_args(openrlhf_package, doc["argv"])
    assert ns.critic.model_name_or_path == "/m" and ns.algo.advantage.estimator == "gae" and ns.ds.lora.rank == 0
    assert (ns.rollout.batch_size, ns.train.batch_size, ns.rollout.n_samples_per_prompt) == (32, 8, 1)
    assert ns.data.prompt_dataset == str(tmp_path / "run" / "data" / "train.jsonl")
    assert doc["names"] == {"recipe": "verl-vs-deepspeed", "adv_estimator": "gae", "variants": [], "steps": 7}
