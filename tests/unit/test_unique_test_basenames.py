"""The test tree has no ``__init__.py`` files, so pytest imports each test file by its basename:
two test files of one name stop the whole collection ("import file mismatch"), in CI only when
both are collected. Checked here, where it costs nothing."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_a_basename_of_its_own():
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "__pycache__" not in path.parts:
            seen[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: sorted(paths) for name, paths in seen.items() if len(paths) > 1}
    assert not shared, f"test files sharing a basename (pytest cannot collect both; rename one): {shared}"
    assert len(seen) > 100  # the tree was found


def test_no_test_calls_asyncio_run_on_the_main_thread():
    """The viewer tests' session-scoped Playwright browser (its sync API) keeps an event loop
    running on the main thread for the rest of the session, so a later ``asyncio.run`` there
    raises "cannot be called from a running event loop" only in a full run. Tests use
    ``tests.helpers.run_async.run_async`` (a thread of its own) instead."""
    calls = [str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
             if "__pycache__" not in p.parts and p.name not in ("run_async.py", Path(__file__).name)
             and "asyncio.run(" in p.read_text()]
    assert not calls, f"asyncio.run( in {calls}: use tests.helpers.run_async.run_async"
