"""Post-import hooks: run a callback right after a module is imported (or now, if it already is),
so the probes can patch Trainer once transformers is imported and start in a child interpreter once
it imports torch, without importing either themselves."""
from __future__ import annotations

import sys
from typing import Any, Callable


class _AfterImport:
    """A meta path finder that runs `callback(module)` right after `name` is imported."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        try:
            sys.meta_path.remove(self)  # once is enough
        except ValueError:
            pass
        spec = None
        for finder in list(sys.meta_path):  # the finders that would have found it (editable installs too)
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback = spec.loader, self.callback
        orig = loader.exec_module

        def exec_module(module: Any) -> None:
            orig(module)
            try:
                callback(module)
            except Exception:  # noqa: BLE001 - a probe never breaks an import
                pass
        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Call `callback(module)` now if `name` is imported, else right after it is."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))  # type: ignore[arg-type]
