"""Retries of the replay store's write transactions (``agentrl.replay.store``).

Several processes may write one database (a training run, an evaluation, ``agentrl replay
rerun``). A write that loses to another one is run again: on SQLite "database is locked"
(the write lock stayed taken for the whole busy timeout, which is SQLite's own wait-and-retry),
on PostgreSQL a deadlock (SQLSTATE 40P01) or a serialization failure (40001). Every write
method is one transaction, and a failed attempt rolled back, so running it again is safe.
After ``WRITE_ATTEMPTS`` tries the error becomes an ``InfraError`` that says so.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, TypeVar

from sqlalchemy.exc import OperationalError

from agentrl.errors import InfraError

WRITE_ATTEMPTS = 3
"""How often a write transaction is tried on a lock or deadlock."""
PG_TRANSIENT = {"40P01": "deadlock detected", "40001": "serialization failure"}
"""PostgreSQL SQLSTATEs after which a write is tried again."""

_T = TypeVar("_T")


def transient_reason(exc: OperationalError, is_sqlite: bool) -> str | None:
    """Why ``exc`` is worth another attempt (``"a locked database"``, ``"deadlock
    detected"``, ...), or ``None`` for an error that would fail again."""
    if is_sqlite:
        msg = str(exc.orig).lower()
        return "a locked database" if ("locked" in msg or "busy" in msg) else None
    return PG_TRANSIENT.get(getattr(exc.orig, "sqlstate", None) or "")


def retry_writes(method: Callable[..., _T]) -> Callable[..., _T]:
    """Decorate a ``ReplayStore`` write method (one transaction) with the retries above.

    Raises:
        InfraError: the last of ``WRITE_ATTEMPTS`` attempts failed on a lock or deadlock; the
            message names the method, the database, the cause and the busy timeout.
    """

    @functools.wraps(method)
    def wrapper(store: Any, *args: Any, **kwargs: Any) -> _T:
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                return method(store, *args, **kwargs)
            except OperationalError as exc:
                why = transient_reason(exc, store._is_sqlite)
                if why is None:
                    raise
                if attempt == WRITE_ATTEMPTS:
                    waited = (f" (each try waited the {store._busy_timeout_s:g} s busy timeout)"
                              if store._is_sqlite else "")
                    raise InfraError(
                        f"replay store {store.url}: {method.__name__} failed {attempt} times on {why}; "
                        f"another process holds the database{waited}: {exc.orig}"
                    ) from exc
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    return wrapper


__all__ = ["PG_TRANSIENT", "WRITE_ATTEMPTS", "retry_writes", "transient_reason"]
