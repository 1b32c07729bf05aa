"""``env.import_modules``: importing the user's modules that register environments and
estimators before the config validates, and the record of what each import added to
``sys.modules`` (``modules_imported_with``, which a joined Ray cluster ships)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

_IMPORTED_WITH: dict[str, tuple[object, tuple[str, ...]]] = {}
"""Env module name -> (the module object that import made, the names it added to sys.modules)."""


def import_user_modules(data: Any) -> None:
    """Import each name of ``data["env"]["import_modules"]`` (``data``: the raw config
    mapping), recording what a first import added to ``sys.modules``. Names that are not
    non-empty strings are skipped (the field's own validation reports them).

    Raises:
        ValueError: a module that cannot be imported, naming it and the error.
    """
    env = data.get("env") if isinstance(data, dict) else None
    names = env.get("import_modules") if isinstance(env, dict) else None
    if not isinstance(names, list):
        return
    for name in names:
        if not isinstance(name, str) or not name:
            continue  # the field's own validation reports it
        before = set(sys.modules)
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ValueError(
                f"env.import_modules: module {name!r} could not be imported ({type(exc).__name__}: {exc}); "
                "it must be importable (on sys.path / PYTHONPATH) in every process of the run"
            ) from exc
        if name not in before:
            _IMPORTED_WITH[name] = (sys.modules.get(name), tuple(m for m in sys.modules if m not in before))


def modules_imported_with(name: str) -> tuple[str, ...] | None:
    """The modules that importing ``name`` (one of ``env.import_modules``) added to
    ``sys.modules`` in this process, itself and its own imports (a helper module beside it)
    among them; None when ``Config`` validation was not what imported it first (then it is
    unknown), and when ``sys.modules`` no longer holds the module that import made (it was
    removed or re-imported, perhaps from another file: the record would name another
    module's helpers). ``agentrl.cluster.actors.ray_join`` ships the user's ones to a joined cluster."""
    record = _IMPORTED_WITH.get(name)
    if record is None or sys.modules.get(name) is not record[0]:
        return None
    return record[1]
