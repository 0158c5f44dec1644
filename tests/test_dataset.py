"""The embedded dataset in verl's own RLHFDataset, and its reward through verl's own loader.

The prompts are turned into token ids the way verl 0.9.1's agent loop does it (the Continuous
Token builder chosen by the config's model_type), with the synthetic tokenizer, so a chat
template or special token that verl's rollout cannot use fails here and not on a GPU host.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import verl
from omegaconf import OmegaConf
from verl_recipes import RecipeError
from verl_recipes.cli import main
from verl_recipes.workload.arch import resolve_arch
from verl_recipes.workload.dataset import DATA_SOURCE, build, write
from verl_recipes.workload.reward import compute_score, compute_text_score, extract_answer, text_share
from verl_recipes.workload.synth import build_tokenizer, hf_config, shape_config

REWARD_KEYS = {"reward.custom_reward_function.path": "pkg://verl_recipes.workload.reward",
               "reward.custom_reward_function.name": "compute_score"}  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("arith")
    assert main(["dataset", "--out", str(out), "--train", "300", "--test", "40", "--seed", "3"]) == 0
    return out


@pytest.fixture(scope="module", params=["llama-2-7b", "qwen2-0.5b"])
def tokenizer(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """(model_type, the synthetic tokenizer of a tiny `arch`), as synth-model writes it."""
    config = hf_config(shape_config(resolve_arch(request.param), scale="tiny"))
    return config.model_type, build_tokenizer(config)


def _data_config(cache: Path, **over: Any) -> Any:
    """verl's own data config defaults (trainer/config/data/legacy_data.yaml) with our overrides."""
    base = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "data" / "legacy_data.yaml")
    over = {"max_prompt_length": 256, "filter_overlong_prompts": True, "cache_dir": str(cache), **over}
    return OmegaConf.merge(base, OmegaConf.create(over))


def test_rows_are_deterministic_distinct_and_correct() -> None:
    a, b, c = build(200, 50, seed=0), build(200, 50, seed=0), build(200, 50, seed=1)
    assert a == b and a != c
    assert build(20, 50, seed=0)["test"] == a["test"]  # the test split does not move with --train
    questions = [r["extra_info"]["question"] for split in a.values() for r in split]
    assert len(set(questions)) == len(questions) == 250
    step = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
    ops = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "/": int.__floordiv__}
    for split, rows in a.items():
        for i, r in enumerate(rows):
            assert r["extra_info"] == {**r["extra_info"], "split": split, "index": i}
            sol, final = r["extra_info"]["answer"].rsplit("\n#### ", 1)
            assert final == r["reward_model"]["ground_truth"]
            steps = step.findall(sol)
            assert steps, sol
            for x, op, y, z in steps:  # every step of the worked answer is right arithmetic
                assert ops[op](int(x), int(y)) == int(z), sol
                assert op != "/" or int(x) % int(y) == 0
            assert int(steps[-1][3]) == int(final)
            assert r["extra_info"]["question"] in r["prompt"][0]["content"]
            assert "####" in r["prompt"][0]["content"]


def test_bad_sizes_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="--train and --test"):
        write(tmp_path, 0, 10)


def test_parquet_layout_is_verls(data: Path) -> None:
    df = pd.read_parquet(data / "train.parquet")
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(df) == 300 and len(pd.read_parquet(data / "test.parquet")) == 40
    row = df.iloc[0]
    assert row["data_source"] == DATA_SOURCE
    assert dict(row["prompt"][0])["role"] == "user"
    assert row["reward_model"]["style"] == "rule"
    assert row["reward_model"]["ground_truth"].lstrip("-").isdigit()
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0


def test_rlhf_dataset_yields_prompt_ids(data: Path, tokenizer: tuple[str, Any], tmp_path: Path) -> None:
    from torch.utils.data import DataLoader
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    model_type, tok = tokenizer
    ds = RLHFDataset(str(data / "train.parquet"), tok, _data_config(tmp_path))
    assert len(ds) == 300  # the overlong filter tokenized every prompt and kept it
    builder = create_continuous_token_builder(tok, hf_model_type=model_type)
    for i in (0, 1, 299):
        item = ds[i]
        assert item["data_source"] == DATA_SOURCE and item["index"] == i
        ids = builder.build_initial_tokens(item["raw_prompt"])  # what SingleTurnAgentLoop sends to vLLM
        assert 0 < len(ids) <= 256 and max(ids) < len(tok)
        text = tok.decode(ids)
        assert item["extra_info"]["question"] in text and text.endswith("assistant\n")
    batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=collate_fn)))
    assert batch["dummy_tensor"].shape[0] == 4 and len(batch["reward_model"]) == 4


def test_rlhf_dataset_filter_really_measures(data: Path, tokenizer: tuple[str, Any], tmp_path: Path) -> None:
    """A limit below every prompt's length must drop every row: proof the lengths are real."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    _, tok = tokenizer
    cfg = _data_config(tmp_path, max_prompt_length=12)
    assert len(RLHFDataset(str(data / "test.parquet"), tok, cfg)) == 0


def test_reward_scores_generated_items() -> None:
    rows = build(60, 1, seed=5)["train"]
    for r in rows:
        gt = r["reward_model"]["ground_truth"]
        good = f"Let me see. {r['extra_info']['answer']}"
        assert compute_score(DATA_SOURCE, good, gt, r["extra_info"]) == 1.0
        assert compute_score(DATA_SOURCE, f"I think #### {int(gt) + 1}", gt) == 0.0
        assert compute_score(DATA_SOURCE, f"The answer is {gt}.", gt) == 1.0  # no marker: last integer
        assert compute_score(DATA_SOURCE, f"#### {gt} but maybe 7 or 8", gt) == 1.0  # the marker wins
        assert compute_score(DATA_SOURCE, "no idea", gt) == 0.0
    assert extract_answer("#### 1,234") == 1234 and extract_answer("#### -5") == -5
    assert extract_answer("x" * 5000 + "#### 9") == 9
    assert compute_score(DATA_SOURCE, "#### 3", "not a number") == 0.0


def test_reward_loads_through_verls_config_keys() -> None:
    """The keys the launcher sets, through verl 0.9.1's own loader, and the call the reward manager makes."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = OmegaConf.create()
    for k, v in REWARD_KEYS.items():
        OmegaConf.update(cfg, k, v, force_add=True)
    fn = get_custom_reward_fn(cfg)
    assert fn is not None
    row = build(1, 1, seed=0)["test"][0]
    gt = row["reward_model"]["ground_truth"]
    kw = {"data_source": DATA_SOURCE, "ground_truth": gt, "extra_info": dict(row["extra_info"])}
    assert fn(solution_str=f"... #### {gt}", **kw) == 1.0
    assert fn(solution_str="... #### 100000", **kw) == 0.0


def test_reward_file_loads_without_the_package() -> None:
    """The file path works too: the module needs only the standard library."""
    import verl_recipes.workload.reward as reward
    from verl.utils.import_utils import load_extern_object

    fn = load_extern_object(module_path=reward.__file__, object_name="compute_score")
    assert fn is not compute_score and fn("x", "#### 12", "12") == 1.0  # type: ignore[operator]


def test_text_share_counts_the_characters_outside_filler_ids() -> None:
    assert text_share("Ana has 3 apples. #### 3") == 1.0
    assert text_share("<|reserved_12|><|reserved_7|>") == 0.0
    assert text_share("ab<|reserved_0|>") == pytest.approx(2 / 16)  # the filler is 14 characters
    assert text_share("") == 0.0  # an empty answer writes no text
    assert compute_text_score(DATA_SOURCE, "no filler here", "12") == 1.0
    assert compute_score(DATA_SOURCE, "no filler here", "12") == 0.0  # the default is unchanged


def test_a_random_models_answers_score_on_the_text_reward_from_the_start(tokenizer: tuple[str, Any]) -> None:
    """Uniform draws over the vocabulary, as a random model samples them, decoded as verl's reward
    manager decodes them (skip_special_tokens), 64 tokens an answer: some answers score above 0,
    none near 1, and most groups of 8 differ (a group of equal scores teaches GRPO nothing);
    answers of learned tokens score 1. Qwen2's 151,936 ids leave the fewest learned ones."""
    import random

    _, tok = tokenizer
    vocab = len(tok)
    learned = [i for i in range(vocab) if not tok.convert_ids_to_tokens(i).startswith("<|reserved_")]
    rng = random.Random(0)
    answers = [tok.decode([rng.randrange(vocab) for _ in range(64)], skip_special_tokens=True) for _ in range(256)]
    scores = [compute_text_score(DATA_SOURCE, a, "0") for a in answers]
    assert 0.0 < max(scores) < 0.5 and sum(s > 0 for s in scores) >= len(scores) // 8, scores
    groups = [scores[i : i + 8] for i in range(0, len(scores), 8)]
    assert sum(len(set(g)) > 1 for g in groups) >= len(groups) * 3 // 4
    text = tok.decode([rng.choice(learned) for _ in range(64)], skip_special_tokens=True)
    assert compute_text_score(DATA_SOURCE, text, "0") == 1.0, text


def test_verls_loader_finds_the_text_reward_by_the_name_a_recipe_layer_gives() -> None:
    import verl_recipes.workload.reward as reward
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": reward.__file__, "name": "compute_text_score"}}}
    )
    fn = get_custom_reward_fn(cfg)
    assert fn is not None
    kw = {"data_source": DATA_SOURCE, "ground_truth": "3", "extra_info": {}}
    assert fn(solution_str="x<|reserved_1|>", **kw) == pytest.approx(1 / 15)
