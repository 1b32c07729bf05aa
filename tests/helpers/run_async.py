"""``run_async(coro)``: ``asyncio.run`` on a thread of its own. A test in the main thread cannot
rely on it having no running event loop: the viewer tests' session-scoped Playwright browser
(its sync API) keeps one running there for the rest of the session."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T], timeout_s: float = 300.0) -> T:
    """Run ``coro`` to its end with ``asyncio.run`` in a new thread; return its result or raise
    its exception (``TimeoutError`` after ``timeout_s`` seconds)."""
    out: dict[str, Any] = {}

    def main() -> None:
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc

    t = threading.Thread(target=main, name="run-async", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"the coroutine did not finish in {timeout_s} s")
    if "error" in out:
        raise out["error"]
    return out["value"]
