"""design.md, "Who may import whom", as one table: every row is checked against every
import in every ``.py`` file of ``agentrl/``, ``environments/``, ``sandboxes/`` and
``critics/``, read with ``ast`` so lazy (function-level) imports, ``TYPE_CHECKING`` imports
and ``importlib.import_module("...")`` calls with a literal name count as much as the
module-level ones. A breach fails with ``file:line``, the import and the rule it breaks.

A module's row is the row of its longest matching prefix. Rows for modules the design page
does not name:

- ``agentrl.config``: the run config (pydantic, YAML). It may import ``agentrl.types`` /
  ``agentrl.errors``, the ``critics`` registry (to check ``algorithm.advantage`` against
  the registered estimators) and ``agentrl.trainer.config`` (the trainer's own config
  classes and their validation: one config class per thing, issue 9 item 5); never a room
  that *uses* the config (rollout, credit, cluster, replay, environments, sandboxes, the
  rest of the trainer).
- ``agentrl.tasks``: the task source, producer of ``EpisodeRequest`` (design.md's first
  box): types, errors, config only; never its consumer, the rollout loop, nor
  ``environments`` (importing it must register no environment).
- ``agentrl.eval``: held-out evaluation's metrics (pass@k, bootstrap intervals) and their
  terminal table: types, errors, numpy, rich; the eval run itself is wiring
  (``agentrl.cluster.evaluate``).
- ``agentrl.replay.diagnose``: ``agentrl diagnose``'s checks (pure functions of a run read
  through the store's read API) and their terminal report: the replay room's row plus ``rich``.
- ``agentrl.model_zoo``: model preparation (``agentrl models prepare``): errors only of ours.
- ``agentrl`` (``agentrl/__init__.py``): the public API facade. Like the CLI it may reach
  anything, but only lazily (inside functions), so ``import agentrl`` stays cheap: its
  module-level imports are the standard library and ``agentrl.errors``, besides the
  ``if TYPE_CHECKING:`` block that shows type checkers the forwarded names (it never runs).
- ``environments.humaneval.harness``: scripts that run inside the sandbox, so standard
  library only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("agentrl", "environments", "sandboxes", "critics")
OURS = set(PACKAGES)
ANY = None  # "no restriction" for a row's `ours` or `third_party`


@dataclass(frozen=True)
class Rule:
    """One row of the table.

    ``ours``: prefixes of our modules the row may import (``ANY``: all); a module always
    may import its own package (``own``). ``third_party``: top-level names allowed outside
    the standard library (``ANY``: all). ``forbidden``: prefixes never allowed, ours or not,
    checked first (they say "never" in design.md). ``module_level_only``: restrictions
    apply to module-level imports only (lazy ones are free), for the facade.
    """

    prefix: str
    text: str
    ours: frozenset[str] | None
    third_party: frozenset[str] | None = ANY
    forbidden: frozenset[str] = frozenset()
    own: str | None = None
    module_level_only: bool = False
    no_names: frozenset[str] = frozenset()  # names never imported (e.g. Episode in critics)


def _fs(*names: str) -> frozenset[str]:
    return frozenset(names)


TE = ("agentrl.types", "agentrl.errors")
NEVER_DOCKER = ("docker",)  # design.md: `docker` is imported only inside sandboxes/docker/

RULES: tuple[Rule, ...] = (
    Rule("agentrl.errors", "agentrl.errors: nothing of ours", ours=_fs(), third_party=_fs()),
    Rule("agentrl.types", "agentrl.types: agentrl.errors only (torch for annotations)",
         ours=_fs("agentrl.errors"), third_party=_fs("torch", "numpy")),
    Rule("sandboxes.docker", "sandboxes/docker/: types, errors, sandboxes.*; the one home of `docker`",
         ours=_fs(*TE), own="sandboxes"),
    Rule("sandboxes", "sandboxes: types and errors only; `docker` only inside sandboxes/docker/",
         ours=_fs(*TE), own="sandboxes", forbidden=_fs(*NEVER_DOCKER, "vllm", "ray", "torch", "gymnasium")),
    Rule("environments.humaneval.harness", "the in-sandbox harness: standard library only",
         ours=_fs(), third_party=_fs()),
    Rule("environments", "environments: gymnasium, the sandboxes interface, types, errors; never a "
         "trainer, an engine, the rollout loop, the credit room or docker",
         ours=_fs(*TE, "sandboxes.base"), own="environments",
         forbidden=_fs("agentrl.trainer", "agentrl.rollout", "agentrl.credit", "agentrl.cluster",
                       "vllm", "ray", "torch", *NEVER_DOCKER)),
    Rule("critics", "critics: types, errors, torch, numpy; arrays in, arrays out (no Episode)",
         ours=_fs(*TE), third_party=_fs("torch", "numpy"), own="critics", no_names=_fs("Episode")),
    Rule("agentrl.credit", "agentrl.credit: types, config, errors, critics",
         ours=_fs(*TE, "agentrl.config", "critics"), own="agentrl.credit",
         forbidden=_fs("vllm", "ray", "gymnasium", *NEVER_DOCKER)),
    Rule("agentrl.rollout", "agentrl.rollout: engines, the tokenizer, types, errors; environments "
         "only through the gymnasium registry",
         ours=_fs(*TE), own="agentrl.rollout", forbidden=_fs("ray", *NEVER_DOCKER)),
    Rule("agentrl.trainer", "agentrl.trainer: types, errors, critics' models and losses, torch; never "
         "environments, sandboxes, rollout, credit or docker",
         ours=_fs(*TE, "critics"), own="agentrl.trainer", forbidden=_fs("vllm", "gymnasium", *NEVER_DOCKER)),
    Rule("agentrl.replay", "agentrl.replay: types, errors, SQLAlchemy, Alembic, the web app",
         ours=_fs(*TE), own="agentrl.replay",
         third_party=_fs("sqlalchemy", "alembic", "fastapi", "jinja2", "starlette", "uvicorn", "numpy")),
    Rule("agentrl.replay.diagnose", "agentrl.replay.diagnose: the symptom-table checks over the store's read API "
         "and their terminal report: types, errors, the replay room, rich",
         ours=_fs(*TE), own="agentrl.replay", third_party=_fs("sqlalchemy", "rich")),
    Rule("agentrl.cluster", "agentrl.cluster: the wiring (anything but docker)", ours=ANY,
         forbidden=_fs(*NEVER_DOCKER)),
    Rule("agentrl.cli", "agentrl.cli: the one entry point (anything but docker)", ours=ANY,
         forbidden=_fs(*NEVER_DOCKER)),
    # Rows design.md does not name (see the module docstring).
    Rule("agentrl.config", "agentrl.config: types, errors, the critics registry, agentrl.trainer.config; "
         "no room that uses the config", ours=_fs(*TE, "critics", "agentrl.trainer.config"),
         third_party=_fs("pydantic", "yaml")),
    Rule("agentrl.tasks", "agentrl.tasks: types, errors, config; never the rollout loop or environments",
         ours=_fs(*TE, "agentrl.config"), third_party=_fs("numpy")),
    Rule("agentrl.eval", "agentrl.eval: the eval metrics (pass@k, bootstrap) and their terminal report: "
         "types, errors, numpy, rich", ours=_fs(*TE), own="agentrl.eval", third_party=_fs("numpy", "rich")),
    Rule("agentrl.model_zoo", "agentrl.model_zoo: errors only of ours",
         ours=_fs("agentrl.errors"), forbidden=_fs("vllm", "ray", *NEVER_DOCKER)),
    Rule("agentrl", "agentrl/__init__.py: the public API, imported lazily (module level: stdlib, errors)",
         ours=_fs("agentrl.errors"), third_party=_fs(), module_level_only=True),
)


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    target: str  # the absolute module (for ours: module.name of a from-import)
    names: tuple[str, ...]
    module_level: bool
    shown: str = ""  # the statement as written, for the failure message
    type_only: bool = False  # under `if TYPE_CHECKING:`: read by type checkers, never run


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
                out.append(Import(path, node.lineno, a.name, (), at_top, f"import {a.name}", typed))
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve_relative(module, path, node.level, node.module) if node.level else (node.module or "")
            names = tuple(a.name for a in node.names)
            shown = f"from {'.' * node.level}{node.module or ''} import {', '.join(names)}"
            if mod.split(".")[0] in OURS:
                # `from agentrl import types` imports agentrl.types: judge each name as a submodule.
                for n in names:
                    out.append(Import(path, node.lineno, f"{mod}.{n}", (n,), at_top, shown, typed))
            else:
                out.append(Import(path, node.lineno, mod, names, at_top, shown, typed))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in dynamic))):
            out.append(Import(path, node.lineno, node.args[0].value, (), at_top,
                              f"import_module({node.args[0].value!r})"))
    return out


def _within(target: str, prefixes: frozenset[str] | set[str]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def rule_for(module: str) -> Rule | None:
    best = [r for r in RULES if module == r.prefix or module.startswith(r.prefix + ".")]
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
        own = rule.own or rule.prefix
        if _within(target, {own}):
            return None
        return "not an allowed module of ours"
    if top in sys.stdlib_module_names:
        return None
    if rule.third_party is ANY or top in rule.third_party:
        return None
    return "third-party package not allowed here"


def _files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_every_module_has_a_row():
    rowless = [_module_name(p) for p in _files() if rule_for(_module_name(p)) is None]
    assert not rowless, f"modules no row of the import table covers: {rowless}"


@pytest.mark.parametrize("rule", RULES, ids=[r.prefix for r in RULES])
def test_import_rule(rule: Rule):
    files = [p for p in _files() if rule_for(_module_name(p)) is rule]
    assert files, f"no module matches the row {rule.prefix!r}: the table and the tree disagree"
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


def test_import_agentrl_and_agentrl_tasks_stay_cheap():
    """``import agentrl`` and ``import agentrl.tasks`` pull in no heavy room and register no
    environment (design.md: environments reach the rollout only through the registry)."""
    code = ("import sys, agentrl, agentrl.tasks\n"
            "heavy = sorted(m for m in ('torch', 'ray', 'vllm', 'transformers', 'environments', "
            "'sandboxes', 'agentrl.rollout', 'agentrl.trainer', 'agentrl.cluster') if m in sys.modules)\n"
            "import gymnasium\n"
            "ours = sorted(k for k in gymnasium.registry if k.startswith('agentrl/'))\n"
            "print(heavy, ours)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []", out.stdout
