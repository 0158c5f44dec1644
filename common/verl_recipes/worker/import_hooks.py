"""Run a function right after a named module is imported, in any process, without importing it.

Ray's worker_process_setup_hook runs in every worker process (TransferQueue storage, agent-loop,
reward and vLLM server actors too). A patch that imported its target up front would make each of
them import verl's FSDP engine (torch, transformers, peft: seconds of CPU each) before doing its
own work, and that is start-up time of the whole run. Registering the patch here costs nothing:
it is applied by the import system the moment the target module finishes executing, in exactly
the processes that use it; a module imported already is patched at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]

_hooks: dict[str, list[Hook]] = {}
_lock = threading.Lock()


def after_import(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is imported (now, if it already is); idempotent per hook."""
    with _lock:
        hooks = _hooks.setdefault(name, [])
        if hook in hooks:
            return
        hooks.append(hook)
        if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _PostImportFinder())
    mod = sys.modules.get(name)
    if mod is not None:
        hook(mod)


#: marks a function that `replacing` put in place (``__wrapped__`` does not: torch's and other
#: decorators set it too)
PATCHED = "__verl_recipes_patched__"


def replacing(name: str, make: Callable[[Any], Any]) -> Hook:
    """A hook that replaces the module's function `name` (``Class.method`` for a method) with
    ``make(original)``, once however often it runs."""

    def patch(mod: ModuleType) -> None:
        *path, attr = name.split(".")
        owner: Any = mod
        for part in path:
            owner = getattr(owner, part)
        current = getattr(owner, attr)
        if not getattr(current, PATCHED, False):
            wrapper = make(current)
            setattr(wrapper, PATCHED, True)
            setattr(owner, attr, wrapper)

    return patch


def registered(name: str) -> list[Hook]:
    """The hooks waiting on (or applied to) ``name``, in registration order."""
    return list(_hooks.get(name, ()))


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the hooks; everything else is the real loader's."""

    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self._inner, self._name = inner, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        for hook in registered(self._name):
            hook(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks
        return getattr(self._inner, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None
