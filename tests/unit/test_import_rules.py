"""docs/design.md, "Who may import whom": the table there is read here and every row is
checked against every import in every ``.py`` file of ``agentrl/``, ``environments/``,
``sandboxes/`` and ``critics/``, read with ``ast`` so lazy (function-level) imports,
``TYPE_CHECKING`` imports and ``importlib.import_module("...")`` calls with a literal name
count as much as the module-level ones. A breach fails with ``file:line``, the import and
the rule it breaks. How a row's cells are read is written above the table on that page
(``parse_rules`` implements it).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"
PACKAGES = ("agentrl", "environments", "sandboxes", "critics")
OURS = set(PACKAGES)
ANY = None  # "no restriction" for a row's `ours` or `third_party`


@dataclass(frozen=True)
class Rule:
    """One row of the table.

    ``ours``: prefixes of our modules the row may import (``ANY``: all); a module always
    may import its own row's package (the prefix). ``third_party``: top-level names allowed
    outside the standard library (``ANY``: all). ``forbidden``: prefixes never allowed, ours
    or not, checked first. ``module_level_only``: restrictions apply to module-level imports
    only (lazy ones are free), for the facade. ``no_names``: names never imported (e.g.
    ``Episode`` in critics). ``planned``: a room the page marks *(next)*.
    """

    prefix: str
    text: str
    ours: frozenset[str] | None
    third_party: frozenset[str] | None = ANY
    forbidden: frozenset[str] = frozenset()
    module_level_only: bool = False
    no_names: frozenset[str] = frozenset()
    planned: bool = False


_TICKED = re.compile(r"`([^`]+)`")
_NAMES = re.compile(r"the names? ((?:`[^`]+`(?:,\s*|\s+and\s+)?)+)")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_rules(text: str) -> tuple[Rule, ...]:
    """The rows of the first table under ``## Who may import whom`` in ``text`` (the
    design page). Columns: module, of ours it may import, third-party, never, rule."""
    section = text.split("\n## Who may import whom\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.lower() for c in _cells(lines[0])]
    assert header[:4] == ["module", "of ours, it may import", "third-party", "never"], header
    rules = []
    for line in lines[2:]:  # after the header and its |---| line
        module, ours, third, never, text_ = _cells(line)[:5]
        prefix = _TICKED.findall(module)[0]
        ours_set = frozenset(_TICKED.findall(ours)) or (ANY if "anything" in ours else frozenset())
        third_set = frozenset(_TICKED.findall(third)) or (ANY if third.strip() == "any" else frozenset())
        names = frozenset(n for group in _NAMES.findall(never) for n in _TICKED.findall(group))
        forbidden = frozenset(_TICKED.findall(_NAMES.sub("", never)))
        rules.append(Rule(prefix, f"{prefix}: {text_}", ours=ours_set, third_party=third_set,
                          forbidden=forbidden, module_level_only="module level only" in module,
                          no_names=names, planned="(next)" in module))
    assert rules, "no rows in docs/design.md's import table"
    return tuple(rules)


RULES: tuple[Rule, ...] = parse_rules(DESIGN.read_text())


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    target: str  # the absolute module (for ours: module.name of a from-import)
    names: tuple[str, ...]
    module_level: bool
    shown: str = ""  # the statement as written, for the failure message
    type_only: bool = False  # under `if TYPE_CHECKING:`: read by type checkers, never run
    end_line: int = 0  # the statement's last line (a parenthesised from-import spans several)


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(module: str, path: Path, level: int, name: str | None) -> str:
    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = pkg[: len(pkg) - (level - 1)] if level > 1 else pkg
    return ".".join(base + ([name] if name else []))


def _imports(path: Path, source: str | None = None) -> list[Import]:
    """Every import of the file ``path`` (or of ``source`` read as if it were that file)."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    module = _module_name(path)
    # An import runs when the module is imported unless it sits inside a function (or a
    # lambda): module level, under a module-level `if`/`try` (TYPE_CHECKING) and in a class
    # body all count as module-level; only function bodies are lazy.
    lazy: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            lazy.update(id(n) for n in ast.walk(fn) if n is not fn)
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (getattr(node.test, "id", None) == "TYPE_CHECKING"
                                         or getattr(node.test, "attr", None) == "TYPE_CHECKING"):
            type_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    # Names bound to importlib.import_module (`from importlib import import_module as im`).
    dynamic = {"import_module", "__import__"} | {
        a.asname for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "importlib"
        for a in n.names if a.name == "import_module" and a.asname}
    out: list[Import] = []
    for node in ast.walk(tree):
        at_top, typed = id(node) not in lazy, id(node) in type_only
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append(Import(path, node.lineno, a.name, (), at_top, f"import {a.name}", typed, node.end_lineno))
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve_relative(module, path, node.level, node.module) if node.level else (node.module or "")
            names = tuple(a.name for a in node.names)
            shown = f"from {'.' * node.level}{node.module or ''} import {', '.join(names)}"
            if mod.split(".")[0] in OURS:
                # `from agentrl import types` imports agentrl.types: judge each name as a submodule.
                for n in names:
                    out.append(Import(path, node.lineno, f"{mod}.{n}", (n,), at_top, shown, typed, node.end_lineno))
            else:
                out.append(Import(path, node.lineno, mod, names, at_top, shown, typed, node.end_lineno))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in dynamic))):
            out.append(Import(path, node.lineno, node.args[0].value, (), at_top,
                              f"import_module({node.args[0].value!r})"))
    return out


def _within(target: str, prefixes: frozenset[str] | set[str]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


FACADE = "agentrl"  # the public API's row: agentrl/__init__.py alone, never a fallback for agentrl.*


def rule_for(module: str) -> Rule | None:
    best = [r for r in RULES if module == r.prefix
            or (r.prefix != FACADE and module.startswith(r.prefix + "."))]
    return max(best, key=lambda r: len(r.prefix)) if best else None


def breach(rule: Rule, imp: Import, module: str) -> str | None:
    """Why ``imp`` breaks ``rule`` (None: it does not)."""
    if rule.module_level_only and (not imp.module_level or imp.type_only):
        return None  # the facade's rule is about what `import agentrl` runs
    target, top = imp.target, imp.target.split(".")[0]
    if top == "__future__":
        return None
    if _within(target, rule.forbidden):
        return "forbidden"
    if bad := sorted(set(imp.names) & rule.no_names):
        return f"imports the name(s) {bad}"
    if top in OURS:
        if rule.ours is ANY or _within(target, rule.ours):
            return None
        if rule.prefix != FACADE and _within(target, {rule.prefix}):
            return None  # its own room (the facade's own room would be everything)
        return "not an allowed module of ours"
    if top in sys.stdlib_module_names:
        return None
    if rule.third_party is ANY or top in rule.third_party:
        return None
    return "third-party package not allowed here"


def _files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_the_table_is_read_as_written():
    """The page's cells become these rows: backticked names, the words *anything* / *any*
    (no restriction), *nothing* / *standard library only* (none), *the name* `X` in "never",
    and the *(module level only)* / *(next)* marks."""
    rows = {r.prefix: r for r in RULES}
    assert rows["critics"] == Rule("critics", rows["critics"].text, ours=frozenset({"agentrl.types", "agentrl.errors"}),
                                   third_party=frozenset({"torch", "numpy"}), no_names=frozenset({"Episode"}))
    assert (rows["agentrl.errors"].ours, rows["agentrl.errors"].third_party) == (frozenset(), frozenset())
    assert (rows["agentrl.cli"].ours, rows["agentrl.cli"].third_party) == (ANY, ANY)
    assert rows["agentrl.cluster"].forbidden >= {"agentrl.driver", "agentrl.commands", "docker"}
    assert rows["agentrl.commands"].ours is ANY and "agentrl.driver" not in rows["agentrl.commands"].forbidden
    assert rows["agentrl"].module_level_only and not rows["agentrl.cli"].module_level_only
    assert not rows["agentrl.hubs"].planned and not rows["agentrl.gateway"].planned and not rows["agentrl.rewards"].planned
    assert {"agentrl.trainer", "agentrl.credit"} <= rows["agentrl.gateway"].forbidden
    assert rule_for("agentrl.driver.controller") is rows["agentrl.driver"]
    assert rule_for("agentrl.cluster.engines.pool") is rows["agentrl.cluster"]
    assert rule_for("agentrl.types.batch") is rows["agentrl.types"]


def test_every_module_has_a_row():
    rowless = [_module_name(p) for p in _files() if rule_for(_module_name(p)) is None]
    assert not rowless, f"modules no row of the import table covers: {rowless}"


@pytest.mark.parametrize("rule", RULES, ids=[r.prefix for r in RULES])
def test_import_rule(rule: Rule):
    files = [p for p in _files() if rule_for(_module_name(p)) is rule]
    if not files:
        assert rule.planned, f"no module matches the row {rule.prefix!r}: the table and the tree disagree"
        pytest.skip(f"{rule.prefix!r} is marked (next): no module of it yet")
    bad = []
    for path in files:
        module = _module_name(path)
        for imp in _imports(path):
            why = breach(rule, imp, module)
            if why is not None:
                where = f"{path.relative_to(REPO)}:{imp.line}"
                lazy = "" if imp.module_level else " (lazy)"
                bad.append(f"{where}: {imp.shown}{lazy} ({imp.target}): {why}; rule: {rule.text}")
    assert not bad, "\n".join(bad)


def test_docker_is_imported_only_inside_sandboxes_docker():
    bad = [f"{p.relative_to(REPO)}:{i.line}: {i.shown}" for p in _files()
           if not _within(_module_name(p), {"sandboxes.docker"})
           for i in _imports(p) if _within(i.target, {"docker"})]
    assert not bad, "docker is imported outside sandboxes/docker/:\n" + "\n".join(bad)


def test_critics_never_touch_an_episode():
    """critics: arrays in, arrays out. Beyond the import check, no attribute access such as
    ``agentrl.types.Episode`` or ``T.Episode`` either (code, not docstrings)."""
    bad = []
    for path in sorted((REPO / "critics").rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(n, ast.Attribute) and n.attr == "Episode") or (isinstance(n, ast.Name) and n.id == "Episode"):
                bad.append(f"{path.relative_to(REPO)}:{n.lineno}")
    assert not bad, "critics use Episode: " + ", ".join(bad)


def test_critics_do_no_io():
    """critics: arrays in, arrays out; no file or console I/O."""
    io_calls = {"open", "print", "input"}
    for path in sorted((REPO / "critics").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        calls = {(n.func.id, n.lineno) for n in ast.walk(tree)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in io_calls}
        assert not calls, f"{path.relative_to(REPO)} calls {sorted(calls)}"


def test_the_checker_sees_lazy_relative_and_dynamic_imports():
    """The reader itself: a lazy import inside a function, a relative import, an import in a
    class body, and ``importlib.import_module`` calls (aliased too) all reach the table with
    their line numbers."""
    src = ("import numpy\n"
           "from . import grpo\n"
           "def f():\n"
           "    import agentrl.rollout.loop\n"
           "    importlib.import_module('docker')\n"
           "class C:\n"
           "    import ray\n"
           "from importlib import import_module as im\n"
           "im('vllm')\n")
    probe = REPO / "critics" / "_probe_for_import_rules.py"  # never written: `source` is read instead
    rule = rule_for("critics._probe_for_import_rules")
    assert rule is not None and rule.prefix == "critics"
    imports = _imports(probe, source=src)
    assert {(i.target, i.line, i.module_level) for i in imports} == {
        ("numpy", 1, True), ("critics.grpo", 2, True), ("agentrl.rollout.loop", 4, False), ("docker", 5, False),
        ("ray", 7, True),  # a class body runs at import time: not lazy
        ("importlib", 8, True), ("vllm", 9, True)}  # an aliased import_module is still seen
    why = {i.target: breach(rule, i, "critics._probe_for_import_rules") for i in imports}
    assert why == {"numpy": None, "critics.grpo": None,
                   "agentrl.rollout.loop": "not an allowed module of ours",
                   "docker": "third-party package not allowed here",
                   "ray": "third-party package not allowed here", "importlib": None,
                   "vllm": "third-party package not allowed here"}


HEAVY = frozenset({"ray", "vllm", "torch", "transformers", "docker"})
_HEAVY_NOTE = re.compile(r"#\s*heavy:\s*([A-Za-z_][\w, ]*)")


def _module_file(module: str) -> Path | None:
    """The file of one of our modules (a package's ``__init__.py``), None when it is not a module."""
    base = REPO / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _loaded_by(target: str) -> list[str]:
    """The modules of ours that importing ``target`` runs: its packages' ``__init__`` files and
    the module itself (``agentrl.x.name`` of ``from agentrl.x import name`` is the module
    ``agentrl.x`` when ``name`` is not a submodule)."""
    parts = target.split(".")
    mods = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return [m for m in mods if _module_file(m) is not None]


_CLOSURE: dict[str, frozenset[str]] = {}


def heavy_closure(module: str) -> frozenset[str]:
    """The heavy third-party packages (``HEAVY``) that importing ``module`` loads: its own
    module-level imports and, recursively, those of every module of ours it imports at
    module level."""
    if module in _CLOSURE:
        return _CLOSURE[module]
    _CLOSURE[module] = frozenset()  # a cycle adds nothing new
    path = _module_file(module)
    found: set[str] = set()
    if path is not None:
        for imp in _imports(path):
            if not imp.module_level or imp.type_only:
                continue
            top = imp.target.split(".")[0]
            if top in HEAVY:
                found.add(top)
            elif top in OURS:
                for m in _loaded_by(imp.target):
                    if m != module:
                        found |= heavy_closure(m)
    _CLOSURE[module] = frozenset(found)
    return _CLOSURE[module]


def lazy_import_breach(imp: Import, module: str, lines: list[str]) -> str | None:
    """Why a function-level import of one of our modules is not allowed (None: it is, or it
    is not one). Allowed only with a ``# heavy: <package>`` note on the statement naming a
    heavy package (``HEAVY``) that the imported module loads and the importing one does not:
    the import defers exactly that cost."""
    if imp.module_level or imp.type_only or imp.target.split(".")[0] not in OURS:
        return None
    text = " ".join(lines[imp.line - 1: max(imp.end_line, imp.line)])
    note = _HEAVY_NOTE.search(text)
    if note is None:
        return "a function-level import of our own module (import it at module level, or say which heavy package it defers: '# heavy: torch')"
    named = {n.strip() for n in note.group(1).split(",") if n.strip()}
    loads = set().union(*(heavy_closure(m) for m in _loaded_by(imp.target))) if _loaded_by(imp.target) else set()
    deferred = (named & HEAVY & loads) - heavy_closure(module)
    if not deferred:
        return (f"the note names {sorted(named)}, but importing {imp.target} loads {sorted(loads) or 'no heavy package'}"
                f" and {module} loads {sorted(heavy_closure(module)) or 'none'} already: nothing is deferred")
    return None


def _lazy_breaches(path: Path, source: str | None = None) -> list[str]:
    module = _module_name(path)
    lines = (path.read_text() if source is None else source).splitlines()
    out = []
    for imp in _imports(path, source):
        why = lazy_import_breach(imp, module, lines)
        if why is not None:
            out.append(f"{path.relative_to(REPO)}:{imp.line}: {imp.shown}: {why}")
    return out


def test_our_modules_are_imported_at_module_level():
    """docs/design.md, beside the table: a function-level import of one of our modules only
    where it defers a heavy package, said on the line; the facade (``agentrl/__init__.py``)
    and the CLI reach the rooms lazily by design."""
    def exempt(module: str) -> bool:
        return module == "agentrl" or module == "agentrl.cli" or module.startswith("agentrl.cli.")

    bad = [b for path in _files() if not exempt(_module_name(path)) for b in _lazy_breaches(path)]
    assert not bad, f"{len(bad)} function-level imports of our own modules:\n" + "\n".join(bad)


def test_a_planted_function_level_import_is_flagged():
    """The rule above catches a hoistable import, accepts a true heavy note, and refuses a
    note that defers nothing."""
    probe = REPO / "agentrl" / "driver" / "_probe_for_lazy_imports.py"  # never written
    src = ("def plain():\n"
           "    from agentrl.tasks import TaskSource\n"
           "def deferred():\n"
           "    from agentrl.trainer.trainer import PolicyTrainer  # heavy: torch\n"
           "def false_note():\n"
           "    from agentrl.errors import ConfigError  # heavy: torch\n"
           "def third_party():\n"
           "    import torch  # heavy: torch\n")
    bad = _lazy_breaches(probe, source=src)
    assert [b.split(":")[1] for b in bad] == ["2", "6"], bad
    assert "function-level import of our own module" in bad[0]
    assert "nothing is deferred" in bad[1]


def test_import_agentrl_and_agentrl_tasks_stay_cheap():
    """``import agentrl`` and ``import agentrl.tasks`` pull in no heavy room and register no
    environment (docs/design.md: environments reach the rollout only through the registry)."""
    code = ("import sys, agentrl, agentrl.tasks\n"
            "heavy = sorted(m for m in ('torch', 'ray', 'vllm', 'transformers', 'environments', "
            "'sandboxes', 'agentrl.rollout', 'agentrl.trainer', 'agentrl.cluster') if m in sys.modules)\n"
            "import gymnasium\n"
            "ours = sorted(k for k in gymnasium.registry if k.startswith('agentrl/'))\n"
            "print(heavy, ours)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []", out.stdout


def test_the_cli_loads_no_heavy_package_before_a_command_runs():
    """``agentrl --help`` (importing ``agentrl.cli``) loads none of torch, ray, vllm or
    transformers: the CLI reaches the rooms lazily, so its help and its usage errors are instant."""
    code = ("import sys, agentrl.cli\n"
            "print(sorted(m for m in ('torch', 'ray', 'vllm', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def _module_graph() -> dict[str, set[str]]:
    """Our modules -> the modules of ours they import (function-level imports included,
    ``TYPE_CHECKING`` ones not): ``from pkg import name`` is an edge to ``pkg.name`` when that
    is a module, else to ``pkg``."""
    graph: dict[str, set[str]] = {}
    for path in _files():
        module = _module_name(path)
        edges = graph.setdefault(module, set())
        for imp in _imports(path):
            if imp.type_only or imp.target.split(".")[0] not in OURS:
                continue
            loaded = _loaded_by(imp.target)
            if loaded and loaded[-1] != module:
                edges.add(loaded[-1])
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    """docs/design.md: no circle in the import graph of our modules, counting imports inside
    functions (a circle hidden in a function is still two modules that need each other)."""
    cycles = _cycles(_module_graph())
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_a_planted_circle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_facade_row_covers_only_agentrl_init_and_flags_a_module_level_room():
    """The public API's row is agentrl/__init__.py's alone (a module such as agentrl.logs needs
    its own row), and a module-level import of a room there is a breach."""
    assert rule_for("agentrl").prefix == FACADE
    assert rule_for("agentrl.logs").prefix == "agentrl.logs"
    probe = REPO / "agentrl" / "__init__.py"
    src = "from agentrl.errors import AgentRLError\nfrom agentrl.driver.controller import train\ndef f():\n    from agentrl.driver.controller import train\n"
    why = [(i.line, breach(rule_for("agentrl"), i, "agentrl")) for i in _imports(probe, source=src)]
    assert why == [(1, None), (2, "not an allowed module of ours"), (4, None)], why
