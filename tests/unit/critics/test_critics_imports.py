"""design.md, "Who may import whom": critics imports only agentrl.types, agentrl.errors,
torch, numpy (and the standard library), and does no I/O."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import critics

ALLOWED_THIRD_PARTY = {"numpy", "torch"}
ALLOWED_OURS = {"agentrl.types", "agentrl.errors"}
IO_CALLS = {"open", "print", "input"}


def _modules() -> list[Path]:
    return sorted(Path(critics.__file__).parent.glob("*.py"))


def test_critics_imports_follow_design():
    bad = []
    for path in _modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "__future__" or top in sys.stdlib_module_names:
                    continue
                if top == "critics" or top in ALLOWED_THIRD_PARTY or name in ALLOWED_OURS:
                    continue
                bad.append(f"{path.name}: import {name}")
    assert not bad, bad
    assert len(_modules()) >= 6


def test_critics_do_no_io():
    for path in _modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        calls = {
            n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        assert not (calls & IO_CALLS), f"{path.name} calls {calls & IO_CALLS}"
