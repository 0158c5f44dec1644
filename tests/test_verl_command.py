"""The reader of a verl job as its users write it (`recipe.verl_command`): the bash its example
scripts use, read as bash expands it, and the trainer's arguments as Hydra's own parser reads them.

The scripts under tests/fixtures/verl-scripts are the project's own; every-construct.sh uses each
construct verl's example scripts use (validation/verl-examples/suite.yaml), the others one
construct the reader refuses each.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_recipes import RecipeError
from verl_recipes.recipe.verl_command import read_argv, read_script, read_text

FIXTURES = Path(__file__).parent / "fixtures" / "verl-scripts"
ENV = {"HOME": "/h"}


def test_every_construct_reads_as_bash_expands_it() -> None:
    cmd = read_script(FIXTURES / "every-construct.sh", env=ENV, args=["trainer.save_freq=5"])
    got = {o.key: (o.line, o.text) for o in cmd.overrides}
    # a quoted list built from variables, as Hydra reads it
    assert got["data.train_files"] == (
        30,
        'data.train_files=["/h/data/gsm8k/train.parquet", "/h/data/math/train.parquet"]',
    )
    # ${VAR:-"default"} with the variable unset, $((arithmetic)) on a variable, ${VAR}
    assert got["data.val_files"][1] == 'data.val_files="/h/data/gsm8k/test.parquet"'
    assert got["data.max_prompt_length"][1] == "data.max_prompt_length=512"
    assert got["data.max_response_length"][1] == "data.max_response_length=256"
    # an `if` on the script's own value took its first branch
    assert got["actor_rollout_ref.rollout.gpu_memory_utilization"][1].endswith("=0.5")
    assert got["actor_rollout_ref.rollout.tensor_model_parallel_size"] == (
        49,
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    )
    # Hydra's + and ++, a single-quoted JSON list, the last of a repeated key wins
    assert got["actor_rollout_ref.model.override_config.attn_implementation"][1].startswith("+actor_rollout_ref")
    assert got["actor_rollout_ref.actor.fsdp_config.param_offload"][1].startswith("++")
    assert got["trainer.logger"][1] == 'trainer.logger=["console", "wandb"]'
    assert cmd.keys()["actor_rollout_ref.model.use_remove_padding"].text.endswith("=false")
    # $@ gives the caller's arguments; `2>&1 | tee log` and the download are not the job
    assert got["trainer.save_freq"][1] == "trainer.save_freq=5"
    assert [o.key for o in cmd.overrides][-2:] == ["trainer.total_epochs", "trainer.save_freq"]
    assert cmd.skipped == (
        "line 25: huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir /h/models/Qwen2.5-0.5B-Instruct",
    )


def test_the_environment_and_positional_arguments_fill_defaults() -> None:
    text = (
        'tp=${1:-4}\nname=${NAME:-run}\npython3 -m verl.trainer.main_ppo a.tp=$tp trainer.experiment_name="${name}_x"\n'
    )
    cmd = read_text(text, "s.sh", env={"NAME": "mine"}, args=["2"])
    assert [o.text for o in cmd.overrides] == ["a.tp=2", 'trainer.experiment_name="mine_x"']
    cmd = read_text(text, "s.sh", env={}, args=[])
    assert [o.text for o in cmd.overrides] == ["a.tp=4", 'trainer.experiment_name="run_x"']


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["python3", "-m", "verl.trainer.main_ppo"], "python3 -m"),
        (["torchrun", "--nproc_per_node", "8", "--standalone", "-m", "verl.trainer.main_ppo"], "torchrun"),
        (["nohup", "env", "VLLM_USE_V1=1", "python3", "-u", "-m", "verl.trainer.main_ppo"], "python3 -m"),
        (
            ["ray", "job", "submit", "--address", "http://h:8265", "--", "python3", "-m", "verl.trainer.main_ppo"],
            "ray job submit",
        ),
    ],
)
def test_the_launchers_verl_examples_use(argv: list[str], launcher: str) -> None:
    cmd = read_argv([*argv, "~trainer.val_before_train", "+data.x={a: 1, b: [1, 2]}", "trainer.nnodes=2"])
    assert cmd.launcher == launcher
    assert [o.text for o in cmd.overrides] == [
        "~trainer.val_before_train",
        '+data.x={"a": 1, "b": [1, 2]}',
        "trainer.nnodes=2",
    ]


def test_config_name_and_verl_own_config_path() -> None:
    cmd = read_argv(
        [
            "python3",
            "-m",
            "verl.trainer.main_ppo",
            "--config-path=config",
            "--config-name=ppo_megatron_trainer.yaml",
            "a=1",
        ]
    )
    assert cmd.config_name == "ppo_megatron_trainer"
    with pytest.raises(RecipeError, match="a config folder of your own"):
        read_argv(["python3", "-m", "verl.trainer.main_ppo", "--config-path", "/mine", "a=1"])


@pytest.mark.parametrize(
    ("script", "line"),
    [
        ("loop.sh", "loop.sh: line 4: a `for` loop is not read here"),
        (
            "substitution.sh",
            "substitution.sh: line 7: an argument of the trainer comes from $(scontrol show hostnames | wc -l)",
        ),
        ("runtime-if.sh", "runtime-if.sh: line 3: this `if` tests $(nvidia-smi -L | wc -l) (line 3)"),
        ("no-trainer.sh", "no-trainer.sh: does not call verl's trainer"),
    ],
)
def test_what_cannot_be_read_statically_is_one_line_naming_the_script_line(script: str, line: str) -> None:
    with pytest.raises(RecipeError) as e:
        read_script(FIXTURES / script, env=ENV)
    assert line in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("python3 -m verl.trainer.main_ppo a=1\npython3 -m verl.trainer.main_ppo a=2\n", "more than once (lines 1, 2)"),
        ("python3 -m verl.trainer.main_ppo 'a=[1,'\n", "line 1: 'a=[1,' is not a Hydra override"),
        ("python3 -m verl.trainer.main_ppo a=1,2\n", "is a sweep"),
        ("python3 verl/trainer/main_ppo.py a=1\n", "line 1: verl's trainer is started in a way not read here"),
        ("x=1 || exit 1\npython3 -m verl.trainer.main_ppo a=1\n", "line 1: `||` is not read here"),
        ("python3 -m verl.trainer.main_ppo a='1\n", "quote is not closed"),
    ],
)
def test_bad_scripts_are_one_line(text: str, says: str) -> None:
    with pytest.raises(RecipeError, match=r"^s\.sh: ") as e:
        read_text(text, "s.sh", env={})
    assert says in str(e.value)
