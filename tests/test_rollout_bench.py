"""rollout-bench's derivation of vLLM's work from a recipe, on CPU against verl's real composed
config and verl's own source: engine arguments, sampling settings and a step's prompt token ids.
The measurement itself is tests/test_gpu_rollout_bench.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from verl_recipes import RecipeError
from verl_recipes.measure import rollout_bench as rb
from verl_recipes.recipe.metadata import get_recipe
from verl_recipes.recipe.run_config import compose_run, default_data_dir, gpu_layout

pytest.importorskip("verl")


def _compose(variants: list[str], sets: list[str], data: Path | None = None) -> tuple[Any, Any]:
    recipe = get_recipe("7b-lora")
    cfg = compose_run(recipe, variants, sets, gpu_layout(recipe), model=Path("/m"), data=data)
    return cfg, rb.model_hf_config(recipe)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = default_data_dir()
    if not (out / "train.parquet").is_file():
        out = tmp_path_factory.mktemp("data")
        rb.ensure_data(out)
    return out


def test_engine_args_cover_every_key_verl_passes_to_vllm() -> None:
    cfg, hf = _compose([], [])
    verl_keys = rb.verl_server_arg_keys()
    assert {"dtype", "gpu_memory_utilization", "max_num_seqs", "compilation_config", "seed"} <= verl_keys
    args = rb.engine_args(cfg, hf)
    missed = verl_keys - set(args) - set(rb.LEFT_OUT)
    assert not missed, f"verl passes {sorted(missed)} to vLLM; rollout-bench does not"
    assert set(rb.LEFT_OUT) <= verl_keys
    rollout = cfg.actor_rollout_ref.rollout
    # the recipe's values, verl's defaults and verl's derivations, as the server makes them
    assert args["gpu_memory_utilization"] == rollout.gpu_memory_utilization == 0.3
    assert args["max_num_seqs"] == rollout.max_num_seqs
    assert args["distributed_executor_backend"] == "uni"  # the recipe's engine_kwargs win over verl's "mp"
    assert args["load_format"] == "dummy"
    assert args["max_model_len"] == hf.max_position_embeddings  # rollout.max_model_len is null
    assert args["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert args["seed"] == rollout.seed
    assert args["override_generation_config"]["max_new_tokens"] == cfg.data.max_response_length
    assert "enable_lora" not in args  # 7b-lora merges its adapter before the sync


def test_engine_args_follow_the_config_where_verl_derives_them() -> None:
    cfg, hf = _compose(
        [],
        [
            "actor_rollout_ref.model.lora.merge=false",
            "actor_rollout_ref.rollout.enable_chunked_prefill=false",
            "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
            "actor_rollout_ref.rollout.max_model_len=2048",
            "actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,8]",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config={cudagraph_mode: PIECEWISE}",
        ],
    )
    args = rb.engine_args(cfg, hf)
    assert args["enable_lora"] is True and args["max_loras"] == 1 and args["max_lora_rank"] >= 64
    assert args["max_model_len"] == 2048
    assert args["max_num_batched_tokens"] == 2048  # raised to max_model_len without chunked prefill
    assert args["compilation_config"] == {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 8]}
    cfg, hf = _compose([], ["actor_rollout_ref.rollout.max_model_len=99999"])
    with pytest.raises(RecipeError, match="max_position_embeddings"):
        rb.engine_args(cfg, hf)


def test_a_steps_prompts_are_the_first_batch_as_verl_sends_them(data: Path) -> None:
    """GRPO: 2 prompts x n=4. Unshuffled, step 1's prompts are the file's first rows, tokenized by
    the model's chat template with the generation prompt; each is sent n times in turn."""
    import pandas as pd
    from verl_recipes.workload.synth import build_tokenizer

    cfg, hf = _compose(["grpo"], ["data.shuffle=false"], data)
    tok = build_tokenizer(hf)
    prompts = rb.step_prompts(cfg, tok, hf.model_type)
    bs, n = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
    assert (bs, n) == (2, 4) and len(prompts) == bs * n
    rows = pd.read_parquet(data / "train.parquet")
    for i in range(bs):
        want = tok.apply_chat_template(list(rows.iloc[i]["prompt"]), add_generation_prompt=True, tokenize=True)
        want = list(want["input_ids"]) if isinstance(want, dict) or hasattr(want, "keys") else list(want)
        assert prompts[i * n : (i + 1) * n] == [want] * n
    # shuffled (the recipe's default), the first batch is another one, the same at every start
    cfg_s, _ = _compose(["grpo"], [], data)
    shuffled = rb.step_prompts(cfg_s, tok, hf.model_type)
    assert shuffled != prompts and shuffled == rb.step_prompts(cfg_s, tok, hf.model_type)


def test_sampling_follows_the_agent_loop_and_the_server() -> None:
    cfg, _ = _compose([], ["actor_rollout_ref.rollout.temperature=0.7"])
    short, long_ = [1] * 40, [1] * 600
    params = rb.sampling(cfg, [short, long_], 4096)
    assert params[0] == {
        "temperature": 0.7,
        "top_p": 1,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": 0,  # the recipe asks verl for the rollout's log-probs
        "ignore_eos": False,
        "max_tokens": 512,
    }
    # a prompt longer than prompt_length gets the rest of prompt + response, within max_model_len
    assert params[1]["max_tokens"] == 512 + 512 - 600
    assert rb.sampling(cfg, [[1] * 1000], 1010)[0]["max_tokens"] == 10
    assert rb.summary(params)["max_tokens_min"] == 424


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "rollout-bench", *args], capture_output=True, text=True, env=env
    )


@pytest.mark.skipif(rb.vllm_available(), reason="this host measures; the CPU path is for hosts without vLLM")
def test_a_cpu_host_refuses_in_one_line_and_a_dry_run_prints_what_it_would_run(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    res = _cli("7b-lora", "--variant", "grpo", "--out", str(out))
    assert res.returncode == 2 and res.stderr.strip() == f"error: {rb.NO_GPU}", res.stderr[-2000:]
    assert not res.stdout
    res = _cli("7b-lora", "--variant", "grpo", "--out", str(out), "--dry-run")
    assert res.returncode == 0, res.stderr[-2000:]
    assert '"gpu_memory_utilization": 0.3' in res.stdout
    assert "prompts: 8 requests (2 prompts x n=4)" in res.stdout
    assert res.stdout.rstrip().endswith(rb.NEEDS_GPU)
    assert not out.exists()


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    res = _cli("7b-lora", "--out", str(mine))
    assert res.returncode == 2 and res.stderr.startswith("error: ") and "exists" in res.stderr
    assert mine.read_text() == "{}"
    res = _cli("7b-lora", "--calls", "0")
    assert res.returncode == 2 and "--calls" in res.stderr
