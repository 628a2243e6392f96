"""Reading ddp_doctor's own source: the modules, and where each catalogue ID is declared."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ddp_doctor"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Module name -> file, for every module of the package."""
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def declarations() -> list[tuple[str, str, int]]:
    """(ID, module, line) of every `check("DDPnnn", ...)` / `declare("DDPnnn", ...)` call."""
    out = []
    for m, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                    "check", "declare") and node.args and isinstance(node.args[0], ast.Constant) \
                    and str(node.args[0].value).startswith("DDP"):
                out.append((str(node.args[0].value), m, node.lineno))
    return out
