"""The committed field list of Megatron-Bridge's GPT provider: what `override_transformer_config` may set.

`python -m verl_recipes.stack.mcore_api --provider-fields` writes it from the pinned wheels;
`recipe.compose` reads it to refuse a key verl would only reject inside a training worker.
"""

from __future__ import annotations

from pathlib import Path

PROVIDER_FIELDS = Path("images") / "megatron-provider-fields.txt"


def read_provider_fields(root: Path) -> frozenset[str]:
    """The committed field list (empty where the checkout has none: then nothing is checked)."""
    path = root / PROVIDER_FIELDS
    if not path.is_file():
        return frozenset()
    return frozenset(ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#"))
