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
