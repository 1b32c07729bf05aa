"""The cache of prepared model folders: where they live, the marker, the lock, the atomic build.

Layout, marker and safety rules are described in :mod:`agentrl.model_zoo`. This module
knows no model: a :class:`_ModelSpec` (a recipe and a build function) comes from
:mod:`agentrl.model_zoo.smollm2` or :mod:`agentrl.model_zoo.tiny`, and
:func:`prepare_folder` builds it once. Standard library only at import time; ``filelock``
is imported when a build is needed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agentrl.errors import InfraError

logger = logging.getLogger(__name__)

MARKER_FILE = ".agentrl-recipe.json"
"""Name of the marker file written last into every prepared folder."""

_RECIPE_VERSION = 1
"""Bump when the conversion code changes in a way that changes the files it writes."""


@dataclass(frozen=True)
class _ModelSpec:
    """A model :func:`prepare_model` can build."""

    description: str
    recipe: Callable[[], dict[str, Any]]
    build: Callable[[Path, Path], None]
    """``build(tmp_dir, cache_dir)`` writes the folder's files (not the marker) into ``tmp_dir``."""


def default_cache_dir() -> Path:
    """Directory that holds prepared model folders (``<dir>/<name>/``).

    ``$AGENTRL_CACHE_DIR/models`` if ``AGENTRL_CACHE_DIR`` is set (the agentrl cache root),
    else ``$XDG_CACHE_HOME/agentrl/models``, else ``~/.cache/agentrl/models``.
    """
    root = os.environ.get("AGENTRL_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "agentrl" / "models"


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of a prepared folder (recipe, ``recipe_hash``, ``build_id``,
    ``build_s``, ``created_at``), or ``None`` when absent or unreadable."""
    try:
        return json.loads((Path(folder) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def prepare_folder(spec: _ModelSpec, name: str, root: Path, *, force: bool = False) -> Path:
    """Build ``root / name`` from ``spec`` unless its marker records the same recipe hash.

    The lock, leftover cleanup and atomic build of :func:`agentrl.model_zoo.prepare_model`
    (which checks ``name`` and picks ``root``); see its docstring for the rules.

    Returns:
        ``root / name``.

    Raises:
        ConfigError: from ``spec.recipe()`` (e.g. the source package is not installed).
        InfraError: the lock could not be taken within an hour, or the build failed its
            own checks.
    """
    target = root / name
    recipe = spec.recipe()
    recipe_hash = _hash(recipe)
    if not force and _is_current(target, recipe_hash):
        return target

    from filelock import FileLock, Timeout

    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / f".{name}.lock"))
    try:
        lock.acquire(timeout=5)
    except Timeout:
        logger.info("waiting for another process preparing %s in %s", name, root)
        try:
            lock.acquire(timeout=3600)
        except Timeout as exc:
            raise InfraError(
                f"could not lock {root / f'.{name}.lock'} within 3600 s: another process "
                f"is still preparing {name!r} (the lock is released when it exits)"
            ) from exc
    try:
        # Another process may have finished the build while this one waited.
        if not force and _is_current(target, recipe_hash):
            return target
        _remove_leftovers(root, name)
        _build_atomically(spec, name, root, target, recipe, recipe_hash)
    finally:
        lock.release()
    return target


def _hash(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def _is_current(target: Path, recipe_hash: str) -> bool:
    marker = read_marker(target)
    return marker is not None and marker.get("recipe_hash") == recipe_hash


def _remove(path: Path) -> None:
    """Remove a folder, or only the link when it is a symlink to one."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _remove_leftovers(root: Path, name: str) -> None:
    """Remove temporary folders of builds that died (caller holds the lock for ``name``)."""
    for pattern in (f".{name}.tmp-*", f".{name}.old-*"):
        for stale in root.glob(pattern):
            _remove(stale)


def _make_readable(folder: Path) -> None:
    """``mkdtemp`` makes 0700 folders and some writers 0600 files; a shared cache wants
    the usual 0755 / 0644."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o755 if path.is_dir() else 0o644)


def _build_atomically(
    spec: _ModelSpec,
    name: str,
    root: Path,
    target: Path,
    recipe: dict[str, Any],
    recipe_hash: str,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
    try:
        logger.info("preparing model %s in %s", name, target)
        start = time.perf_counter()
        spec.build(tmp, root)
        marker = {
            "name": name,
            "recipe": recipe,
            "recipe_hash": recipe_hash,
            "build_id": uuid.uuid4().hex,
            "build_s": round(time.perf_counter() - start, 3),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        # The marker is written last: a folder with a valid marker is complete.
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        _make_readable(tmp)
        if target.exists() or target.is_symlink():
            # A directory cannot be renamed over a non-empty one: move the old one aside
            # first. A reader holding no lock may see no folder for a moment; it then
            # takes the lock, waits for this build and finds the new folder.
            old = root / f".{name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            os.replace(tmp, target)
            _remove(old)
        else:
            os.replace(tmp, target)
        logger.info("prepared model %s in %.1f s", name, marker["build_s"])
    finally:
        if tmp.exists():
            _remove(tmp)
