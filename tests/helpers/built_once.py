"""Session fixtures built once for both pytest processes of ``scripts/test.sh``.

``scripts/test.sh`` runs the suite as two pytest processes side by side (the cluster tests and
the rest) and exports ``AGENTRL_TEST_SHARED_DIR``, a folder both can write, removed when the
script ends. A session fixture that both processes use (``real_runs``: two real training runs,
asked for by the cluster tests and by the viewer's) is then built by whichever process asks
first, under an ``flock``, and read back by the other, instead of being built once in each.
Without the variable (one pytest process) each build goes into the caller's own folder, as
before.

A build that raises leaves no record: the next caller builds again (into an emptied folder).
A caller waits at most ``WAIT_S`` for the other process's build (a hung build fails the waiting
test with a message naming the lock, instead of stalling its part for good).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHARED_DIR_ENV = "AGENTRL_TEST_SHARED_DIR"
WAIT_S = 900.0  # the longest wait for the other process's build (real_runs: about 1 min)


def built_once(name: str, build: Callable[[Path], dict[str, Any]], own_dir: Callable[[], Path], *,
               wait_s: float = WAIT_S) -> dict[str, Any]:
    """What ``build(folder)`` returned (a JSON-able dict), built once per ``scripts/test.sh``
    run when ``$AGENTRL_TEST_SHARED_DIR`` is set (module docstring), else built now into
    ``own_dir()``.

    Args:
        name: the build's name: its folder ``<shared>/<name>``, its lock ``<name>.lock`` and its
            record ``<name>.json`` there.
        build: makes everything inside the folder it is given (empty, existing) and returns the
            record; what it returns must name only files inside that folder, or things that
            outlive the process (a run id).
        own_dir: the folder to build in without a shared folder (e.g. ``tmp_path_factory.mktemp``).

    Raises:
        TimeoutError: the other process held the build's lock for over ``wait_s``.
        Whatever ``build`` raises.
    """
    shared = os.environ.get(SHARED_DIR_ENV)
    if not shared:
        return build(own_dir())
    root = Path(shared)
    record = root / f"{name}.json"
    with open(root / f"{name}.lock", "a") as lock:
        deadline = time.monotonic() + wait_s
        while True:  # the other process may be building: wait for it, not for ever
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{root / name}: the other pytest process has been building it for over "
                                       f"{wait_s:.0f} s (it holds {lock.name})") from None
                time.sleep(0.5)
        if record.is_file():
            return json.loads(record.read_text())
        folder = root / name
        shutil.rmtree(folder, ignore_errors=True)  # what a build that raised left
        folder.mkdir()
        out = build(folder)
        tmp = root / f".{name}.json.tmp"
        tmp.write_text(json.dumps(out))
        tmp.replace(record)
        return out
