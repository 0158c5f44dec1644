"""`verl-recipes dataset`: the embedded arithmetic dataset, written as verl RL parquet.

Recipes must run without downloading anything (the GPU hosts reach no dataset hub), so the
default training data is generated here: short arithmetic word problems with exact integer
answers, which a rule reward (`verl_recipes.workload.reward`) scores without a model. The rows follow
the layout verl's own preprocessors write and `verl.utils.dataset.rl_dataset.RLHFDataset`
reads: `data_source`, `prompt` (chat messages, read through `data.prompt_key`), `ability`,
`reward_model.ground_truth` (what the reward manager passes as `ground_truth`) and
`extra_info.index`. Everything is a pure function of `--seed`, so two hosts that run the same
recipe train on the same prompts. A user dataset in the same layout plugs in by path through
`data.train_files` / `data.val_files` instead.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, cli_types, inflight

DATA_SOURCE = "verl_recipes/arith"
ABILITY = "math"
# The same instruction style as verl's GSM8K example, so the reward's '####' rule applies.
INSTRUCTION = 'Let\'s think step by step and put the final answer after "####".'

_NAMES = [
    "Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena",
    "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Victor", "Wen", "Yara",
]  # fmt: skip
_ITEMS = [
    "apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "coins",
    "cards", "eggs", "balloons", "oranges", "bottles", "tickets", "beads",
]  # fmt: skip
_CONTAINERS = ["boxes", "bags", "crates", "packs", "jars", "baskets"]

Problem = tuple[str, str, int]  # question, worked solution ending in '#### N', answer


def _add(r: random.Random) -> Problem:
    n, it = r.choice(_NAMES), r.choice(_ITEMS)
    a, b = r.randint(2, 99), r.randint(2, 99)
    q = f"{n} has {a} {it} and buys {b} more. How many {it} does {n} have now?"
    return q, f"{n} has {a} + {b} = {a + b} {it}.", a + b


def _sub(r: random.Random) -> Problem:
    n, m = r.sample(_NAMES, 2)
    it = r.choice(_ITEMS)
    a = r.randint(10, 150)
    b = r.randint(1, a - 1)
    q = f"{n} had {a} {it} and gave {b} of them to {m}. How many {it} does {n} have left?"
    return q, f"{n} has {a} - {b} = {a - b} {it} left.", a - b


def _mul(r: random.Random) -> Problem:
    n, it, c = r.choice(_NAMES), r.choice(_ITEMS), r.choice(_CONTAINERS)
    a, b = r.randint(2, 12), r.randint(2, 25)
    q = f"{n} buys {a} {c} of {it} with {b} {it} in each. How many {it} does {n} buy in total?"
    return q, f"{a} {c} of {b} make {a} * {b} = {a * b} {it}.", a * b


def _div(r: random.Random) -> Problem:
    n, it = r.choice(_NAMES), r.choice(_ITEMS)
    k, each = r.randint(2, 9), r.randint(2, 20)
    total = k * each
    q = f"{n} shares {total} {it} equally among {k} friends. How many {it} does each friend get?"
    return q, f"Each friend gets {total} / {k} = {each} {it}.", each


def _two_step(r: random.Random) -> Problem:
    n, it = r.choice(_NAMES), r.choice(_ITEMS)
    a, b = r.randint(5, 80), r.randint(5, 80)
    c = r.randint(1, a + b - 1)
    q = f"{n} has {a} {it}, finds {b} more, and then loses {c}. How many {it} does {n} have at the end?"
    sol = f"After finding some, {n} has {a} + {b} = {a + b}. After losing {c}, {a + b} - {c} = {a + b - c}."
    return q, sol, a + b - c


def _price(r: random.Random) -> Problem:
    n, it = r.choice(_NAMES), r.choice(_ITEMS)
    k, price, paid_extra = r.randint(2, 9), r.randint(2, 15), r.randint(0, 30)
    cost = k * price
    paid = cost + paid_extra
    q = f"{n} buys {k} {it} at {price} dollars each and pays {paid} dollars. How much change does {n} get?"
    sol = f"The {it} cost {k} * {price} = {cost} dollars, so the change is {paid} - {cost} = {paid_extra}."
    return q, sol, paid_extra


_TEMPLATES: list[Callable[[random.Random], Problem]] = [_add, _sub, _mul, _div, _two_step, _price]


def problems(seed: int, stream: str) -> Iterator[Problem]:
    """An endless, deterministic stream of problems; different `stream` names never share state."""
    r = random.Random(f"{DATA_SOURCE}:{seed}:{stream}")  # str seeds hash with SHA-512: stable across runs
    while True:
        yield r.choice(_TEMPLATES)(r)


def make_row(question: str, solution: str, answer: int, split: str, index: int) -> dict[str, Any]:
    """One row in verl's RL layout (what RLHFDataset and the naive reward manager read)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {
            "split": split,
            "index": index,
            "question": question,
            "answer": f"{solution}\n#### {answer}",
        },
    }


def build(n_train: int, n_test: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Train and test rows; no question appears twice, within or across the splits."""
    if n_train < 1 or n_test < 1:
        raise RecipeError(f"--train and --test must be >= 1 (got {n_train} and {n_test})")
    seen: set[str] = set()
    out: dict[str, list[dict[str, Any]]] = {}
    # The test split is drawn first so that growing --train never changes the test set.
    for split, n in (("test", n_test), ("train", n_train)):
        rows: list[dict[str, Any]] = []
        stream = problems(seed, split)
        tries = 0
        while len(rows) < n:
            q, sol, ans = next(stream)
            tries += 1
            if tries > 20 * n + 1000:
                raise RecipeError(f"cannot draw {n} distinct {split} problems; ask for fewer with --{split}")
            if q in seen:
                continue
            seen.add(q)
            rows.append(make_row(q, sol, ans, split, len(rows)))
        out[split] = rows
    return out


MARKER = "dataset.json"  # written next to the parquet files: a folder this command may rewrite


def write(out: Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, Path]:
    """Write train.parquet and test.parquet under `out`; returns split -> path.

    Parquet files this command did not write (no dataset.json beside them) are someone's data:
    they are refused, never replaced. `out` is claimed while it is written (a second writer gets
    one line naming this one), and each file is renamed into place whole, so an interrupted write
    leaves the earlier file or none, and `complete` tells a whole folder from a cut one.
    """

    import pandas as pd

    held = inflight.claim(out, "the dataset")
    try:
        theirs = [f for f in ("train.parquet", "test.parquet") if (out / f).exists()]
        if theirs and not (out / MARKER).is_file():
            raise RecipeError(
                f"--out {out} holds {' and '.join(theirs)} that this command did not write; pass a new folder "
                "(nothing was written)"
            )
        data = build(n_train, n_test, seed)
        out.mkdir(parents=True, exist_ok=True)
        inflight.clear_partials(out / "train.parquet")
        inflight.clear_partials(out / "test.parquet")
        info = {"source": DATA_SOURCE, "seed": seed, "train": n_train, "test": n_test}
        inflight.write_text(out / MARKER, json.dumps(info), "the dataset's marker")
        paths = {}
        for split, rows in data.items():
            path = out / f"{split}.parquet"
            # written under a temporary name and renamed: a parquet file here is always whole
            with inflight.staged_file(path, "the dataset file") as tmp:
                pd.DataFrame(rows).to_parquet(tmp, index=False)
            paths[split] = path
    finally:
        held.release()
    return paths


def complete(out: Path) -> bool:
    """Whether `out` holds a whole dataset this command wrote: its marker, and both parquet files
    with a readable footer (a file an older writer left cut short has none), so a cache entry that
    is not whole is written again rather than trusted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not (out / MARKER).is_file():
        return False
    try:
        return all(pq.read_metadata(out / f"{s}.parquet").num_rows > 0 for s in ("train", "test"))
    except (OSError, pa.ArrowException):
        return False


def corpus(n: int, seed: int = 0) -> list[str]:
    """Text for training the synthetic tokenizer: chat turns of prompts and worked answers."""
    stream = problems(seed, "tokenizer")
    lines = []
    for _ in range(n):
        q, sol, ans = next(stream)
        lines.append(f"user\n{q} {INSTRUCTION}\nassistant\n{sol}\n#### {ans}")
    return lines


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dataset",
        help="write the embedded arithmetic dataset as verl RL parquet",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--out", type=Path, required=True, help="folder for train.parquet and test.parquet")
    p.add_argument("--train", type=cli_types.count, default=4096, help="training rows (default 4096)")
    p.add_argument("--test", type=cli_types.count, default=256, help="test rows (default 256)")
    p.add_argument("--seed", type=cli_types.non_negative, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths = write(args.out, args.train, args.test, args.seed)
    for split, path in paths.items():
        print(f"{split}: {path}")
    print(f"data.train_files={paths['train']} data.val_files={paths['test']}")
    return 0
