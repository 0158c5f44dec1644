"""argparse types for numeric options: a value that means nothing is refused in one line.

`--steps 0`, `--gpus -1`, `--layers 0` or `--cap-gib 0` would otherwise reach a run as a count or a
budget of nothing, and fail minutes later (or never fail: zero steps trains nothing). argparse
prints a type's ArgumentTypeError as `PROG: error: argument --steps: ...` and exits 2, the
project's one-line refusal. Standard library only.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        word = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {word}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def count(text: str) -> int:
    """A count of at least 1 (steps, GPUs, layers, rows)."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1; give a whole number of at least 1")
    return value


def non_negative(text: str) -> int:
    """A whole number of 0 or more (a seed, a hold time, a rank)."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0; give 0 or more")
    return value


def positive(text: str) -> float:
    """A size, rate or interval above 0 (GiB, tokens/s, seconds)."""
    value = float(_number(text, float))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0; give a positive number")
    return value


def fraction(text: str) -> float:
    """A share above 0 and at most 1 (a tolerance, a share of a core)."""
    value = positive(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} is above 1; give a fraction in (0, 1]")
    return value


SET_HELP = "a verl config override (Hydra's KEY=VALUE, +KEY=VALUE adds a key), checked against verl's schema"


def add_set_option(p: argparse.ArgumentParser, help: str = SET_HELP) -> None:
    """`--set KEY=VALUE`, repeatable, into `sets`: one option with one meaning for every command
    that composes a verl config (train, plan, show, rollout-bench, check-bounds)."""
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help=help)
