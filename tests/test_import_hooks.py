"""`verl_recipes.worker.import_hooks`: hooks run when their module is imported, and `replacing`
puts a wrapper in place once, whatever decorators the original carries."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from verl_recipes.worker.import_hooks import PATCHED, after_import, replacing


def test_replacing_wraps_a_decorated_function_and_a_method_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "hooked_mod.py").write_text(
        "import functools\n"
        "def logged(fn):\n"
        "    @functools.wraps(fn)\n"
        "    def wrapper(*a, **k):\n"
        "        return fn(*a, **k)\n"
        "    return wrapper\n"
        "@logged\n"
        "def send(x):\n"
        "    return ('sent', x)\n"
        "class Comm:\n"
        "    def shape(self):\n"
        "        return [0, 0, 0]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[tuple[str, bool]] = []

    def make(tag: str) -> Any:
        def wrap(original: Any) -> Any:
            made.append((tag, hasattr(original, "__wrapped__")))
            return lambda *a, **k: ("patched", original(*a, **k))

        return wrap

    send_hook, shape_hook = replacing("send", make("send")), replacing("Comm.shape", make("shape"))
    after_import("hooked_mod", send_hook)
    after_import("hooked_mod", shape_hook)
    assert "hooked_mod" not in sys.modules
    import hooked_mod  # the hooks run as the import finishes

    assert hooked_mod.send(1) == ("patched", ("sent", 1))
    assert hooked_mod.Comm().shape() == ("patched", [0, 0, 0])
    assert getattr(hooked_mod.send, PATCHED)
    send_hook(hooked_mod)  # a second run (a second registration, a re-import) wraps nothing more
    shape_hook(hooked_mod)
    # the decorated original carried __wrapped__ (as torch.distributed's logged functions do),
    # which is why the marker is an attribute of its own
    assert made == [("send", True), ("shape", False)] and hooked_mod.send(2) == ("patched", ("sent", 2))
    sys.modules.pop("hooked_mod", None)
