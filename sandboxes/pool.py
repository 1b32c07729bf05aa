"""A pool of pre-started sandboxes handed out per episode.

Starting a container costs about 0.2-0.5 s; taking a warm one from the pool costs a lock and
a deque pop. ``SandboxPool`` keeps ``size`` sandboxes started ahead (a background thread
refills it), caps how many exist at once (``max_sandboxes``; ``acquire`` waits when the cap is
reached), and between episodes either *resets* a returned sandbox (its working directory and
``/tmp`` emptied, checked by that same exec) or *replaces* it with a fresh one. A sandbox
returned after an exception (a cancelled rollout included: ``CancelledError``,
``KeyboardInterrupt``) or that fails its reset or a health check is closed and replaced.
Idle sandboxes are health-checked every ``health_check_interval_s`` (one ``true`` exec).

Start-up latency of every sandbox and the latency of every ``acquire`` are recorded
(``stats()``).

Works with any ``Sandbox`` (``sandboxes.base``): the pool only calls ``exec`` and ``close``.
``PooledSandbox`` wraps one lease for code that only calls ``close()`` on its sandbox.
"""

from __future__ import annotations

import collections
import logging
import shlex
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from agentrl.errors import ConfigError, SandboxError
from sandboxes.base import Sandbox

logger = logging.getLogger(__name__)

BetweenEpisodes = Literal["reset", "replace"]
_RECORD_LIMIT = 10_000


@dataclass(frozen=True)
class PoolStats:
    """Counters and latencies of a ``SandboxPool`` (seconds).

    Attributes:
        idle, leased, starting: sandboxes in each state now.
        started, replaced, failed_starts, failed_health_checks: totals since creation.
        startup_p50_s, startup_max_s: start-up latency of the sandboxes created.
        acquire_p50_s, acquire_p95_s: latency of ``acquire`` (0 when none yet).
    """

    idle: int
    leased: int
    starting: int
    started: int
    replaced: int
    failed_starts: int
    failed_health_checks: int
    startup_p50_s: float
    startup_max_s: float
    acquire_p50_s: float
    acquire_p95_s: float


def _quantile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


class SandboxPool:
    """Pre-started sandboxes, one per episode.

    Args:
        factory: makes a new sandbox (e.g. ``lambda: make_sandbox("docker", spec)``);
            may raise ``SandboxError``.
        size: sandboxes kept started and idle ahead of demand (``>= 0``).
        max_sandboxes: cap on sandboxes in existence (idle + leased + starting);
            default ``max(size, 1)``; ``acquire`` waits while the cap is reached.
        between_episodes: ``"reset"`` (empty the working directory and ``/tmp``, reuse) or
            ``"replace"`` (close, start a fresh one).
        health_check_interval_s: idle sandboxes are checked this often (``0``: never).
        workdir: the sandboxes' working directory (what a reset empties).

    Raises:
        ConfigError: a value out of range.

    Use ``with pool.lease() as sandbox: ...``, or ``acquire`` / ``release``. ``close()``
    closes every sandbox, leased ones included.
    """

    def __init__(
        self,
        factory: Callable[[], Sandbox],
        *,
        size: int,
        max_sandboxes: int | None = None,
        between_episodes: BetweenEpisodes = "reset",
        health_check_interval_s: float = 30.0,
        workdir: str = "/work",
    ) -> None:
        if not callable(factory):
            raise ConfigError(f"factory={factory!r} must be callable")
        if not isinstance(size, int) or size < 0:
            raise ConfigError(f"size={size!r} must be an integer >= 0")
        cap = max(size, 1) if max_sandboxes is None else max_sandboxes
        if not isinstance(cap, int) or cap < max(size, 1):
            raise ConfigError(f"max_sandboxes={max_sandboxes!r} must be an integer >= max(size, 1)={max(size, 1)}")
        if between_episodes not in ("reset", "replace"):
            raise ConfigError(f"between_episodes={between_episodes!r}; expected 'reset' or 'replace'")
        if not isinstance(health_check_interval_s, (int, float)) or health_check_interval_s < 0:
            raise ConfigError(f"health_check_interval_s={health_check_interval_s!r} must be >= 0 seconds")
        self._factory = factory
        self.size = size
        self.max_sandboxes = cap
        self.between_episodes = between_episodes
        self.health_check_interval_s = float(health_check_interval_s)
        self._reset_cmd = (
            f"find {shlex.quote(workdir)} /tmp -mindepth 1 -delete 2>/dev/null; "
            f"[ -z \"$(ls -A {shlex.quote(workdir)})\" ]"
        )
        self._cond = threading.Condition()
        self._idle: collections.deque[Sandbox] = collections.deque()
        self._leased: set[int] = set()
        self._leased_objs: dict[int, Sandbox] = {}
        self._starting = 0
        self._closed = False
        self._started = self._replaced = self._failed_starts = self._failed_checks = 0
        self._startup_s: collections.deque[float] = collections.deque(maxlen=_RECORD_LIMIT)
        self._acquire_s: collections.deque[float] = collections.deque(maxlen=_RECORD_LIMIT)
        self._last_error: BaseException | None = None
        self._maintainer = threading.Thread(target=self._maintain, name="sandbox-pool", daemon=True)
        self._maintainer.start()

    # ------------------------------------------------------------------ public

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until ``size`` sandboxes are idle.

        Raises:
            SandboxError: not ready within ``timeout_s`` (the last start error in it).
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self._idle) < self.size:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise SandboxError(
                        f"sandbox pool not ready after {timeout_s:.0f} s: {len(self._idle)}/{self.size} "
                        f"started; last error: {self._last_error!r}"
                    )
                self._cond.wait(left)

    def acquire(self, timeout_s: float | None = None) -> Sandbox:
        """Take a sandbox: a warm idle one when there is one, else a new one if the cap
        allows, else wait for a release.

        Raises:
            SandboxError: the pool is closed, a new sandbox failed to start, or none became
                free within ``timeout_s``.
        """
        t0 = time.perf_counter()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the sandbox pool is closed")
                if self._idle:
                    sb = self._idle.popleft()
                    self._lease(sb, t0)
                    self._cond.notify_all()  # the maintainer refills
                    return sb
                if self._count() < self.max_sandboxes:
                    self._starting += 1
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise SandboxError(
                        f"no sandbox free within {timeout_s} s (max_sandboxes={self.max_sandboxes} all leased)"
                    )
                self._cond.wait(left)
        sb = self._start_one()  # cold start, outside the lock
        with self._cond:
            if self._closed:
                sb.close()
                raise SandboxError("the sandbox pool is closed")
            self._lease(sb, t0)
            return sb

    def release(self, sandbox: Sandbox, *, broken: bool = False) -> None:
        """Give a sandbox back. ``broken=True`` (or ``between_episodes="replace"``) closes
        it and a fresh one is started; otherwise it is reset in the background and, if the
        reset succeeds, becomes idle again.

        Raises:
            ConfigError: ``sandbox`` is not leased from this pool.
        """
        with self._cond:
            if id(sandbox) not in self._leased:
                raise ConfigError(f"sandbox={sandbox!r} is not leased from this pool")
            self._leased.discard(id(sandbox))
            self._leased_objs.pop(id(sandbox), None)
            if self._closed:
                closing = True
            else:
                closing = False
                self._starting += 1  # counted until reset or replaced
            self._cond.notify_all()
        if closing:
            sandbox.close()
            return
        threading.Thread(
            target=self._recycle, args=(sandbox, broken or self.between_episodes == "replace"),
            name="sandbox-pool-recycle", daemon=True,
        ).start()

    @contextmanager
    def lease(self, timeout_s: float | None = None) -> Iterator[Sandbox]:
        """``with pool.lease() as sandbox:``; released at exit, replaced when the block
        raised (a cancelled rollout's sandbox may still be running a command)."""
        sb = self.acquire(timeout_s)
        try:
            yield sb
        except BaseException:
            self.release(sb, broken=True)
            raise
        self.release(sb)

    def stats(self) -> PoolStats:
        with self._cond:
            startup = list(self._startup_s)
            acquire = list(self._acquire_s)
            return PoolStats(
                idle=len(self._idle), leased=len(self._leased), starting=self._starting,
                started=self._started, replaced=self._replaced,
                failed_starts=self._failed_starts, failed_health_checks=self._failed_checks,
                startup_p50_s=statistics.median(startup) if startup else 0.0,
                startup_max_s=max(startup) if startup else 0.0,
                acquire_p50_s=_quantile(acquire, 0.5), acquire_p95_s=_quantile(acquire, 0.95),
            )

    def close(self) -> None:
        """Close every sandbox (idle and leased) and stop the pool. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            victims = list(self._idle) + list(self._leased_objs.values())
            self._idle.clear()
            self._cond.notify_all()
        for sb in victims:
            try:
                sb.close()
            except Exception:  # noqa: BLE001
                logger.exception("closing pooled sandbox %r failed", sb)
        self._maintainer.join(timeout=5)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _count(self) -> int:
        return len(self._idle) + len(self._leased) + self._starting

    def _lease(self, sb: Sandbox, t0: float) -> None:
        self._leased.add(id(sb))
        self._leased_objs[id(sb)] = sb
        self._acquire_s.append(time.perf_counter() - t0)

    def _start_one(self) -> Sandbox:
        """Create one sandbox; ``_starting`` was incremented by the caller and is
        decremented here (also on failure)."""
        t0 = time.perf_counter()
        try:
            sb = self._factory()
        except BaseException as exc:
            with self._cond:
                self._starting -= 1
                self._failed_starts += 1
                self._last_error = exc
                self._cond.notify_all()
            if isinstance(exc, SandboxError):
                raise
            if isinstance(exc, Exception):
                raise SandboxError(f"starting a pooled sandbox failed: {exc!r}") from exc
            raise
        with self._cond:
            self._starting -= 1
            self._started += 1
            self._startup_s.append(time.perf_counter() - t0)
        return sb

    def _recycle(self, sb: Sandbox, replace: bool) -> None:
        ok = False
        if not replace:
            try:
                r = sb.exec(self._reset_cmd, timeout_s=30)
                ok = r.exit_code == 0 and not r.timed_out
                if not ok:
                    logger.warning("reset of %r failed (exit %s): %s", sb, r.exit_code, r.stderr[-500:])
            except Exception as exc:  # noqa: BLE001
                logger.warning("reset of %r failed: %s", sb, exc)
        with self._cond:
            self._starting -= 1
            if ok and not self._closed:
                self._idle.append(sb)
                self._cond.notify_all()
                return
            self._replaced += 1
            self._cond.notify_all()
        try:
            sb.close()
        except Exception:  # noqa: BLE001
            logger.exception("closing %r failed", sb)

    def _maintain(self) -> None:
        """Keep ``size`` sandboxes idle (within the cap); health-check idle ones."""
        last_check = time.monotonic()
        while True:
            with self._cond:
                while not self._closed and not (
                    len(self._idle) + self._starting < self.size and self._count() < self.max_sandboxes
                ):
                    wait = None
                    if self.health_check_interval_s > 0:
                        wait = max(0.0, last_check + self.health_check_interval_s - time.monotonic())
                        if wait == 0:
                            break
                    self._cond.wait(wait)
                if self._closed:
                    return
                need_start = len(self._idle) + self._starting < self.size and self._count() < self.max_sandboxes
                if need_start:
                    self._starting += 1
            if need_start:
                try:
                    sb = self._start_one()
                except BaseException as exc:  # noqa: BLE001
                    logger.warning("pre-starting a sandbox failed: %s", exc)
                    time.sleep(1.0)  # do not spin on a broken backend
                    continue
                with self._cond:
                    if self._closed:
                        closing = True
                    else:
                        closing = False
                        self._idle.append(sb)
                        self._cond.notify_all()
                if closing:
                    sb.close()
                    return
                continue
            last_check = time.monotonic()
            self._health_check()

    def _health_check(self) -> None:
        with self._cond:
            batch = list(self._idle)
            self._idle.clear()
            self._starting += len(batch)
        for sb in batch:
            healthy = False
            try:
                r = sb.exec("true", timeout_s=10)
                healthy = r.exit_code == 0
            except Exception:  # noqa: BLE001
                healthy = False
            with self._cond:
                self._starting -= 1
                if healthy and not self._closed:
                    self._idle.append(sb)
                    self._cond.notify_all()
                    continue
                if not healthy:
                    self._failed_checks += 1
                    self._replaced += 1
                self._cond.notify_all()
            if not healthy:
                logger.warning("pooled sandbox %r failed its health check; replacing it", sb)
            sb.close()


class PooledSandbox:
    """A sandbox leased from a ``SandboxPool`` for one episode, for code that only knows
    ``close()`` (an environment, the rollout worker): everything is the leased sandbox's,
    except ``close()``, which hands it back to the pool (reset or replaced there) once, and
    ``discard()``, which hands it back to be closed and replaced (a command the sandbox may
    still run must not reach the next episode).

    Args:
        pool: the pool ``sandbox`` was acquired from.
        sandbox: the leased sandbox (``pool.acquire()``).
    """

    def __init__(self, pool: SandboxPool, sandbox: Sandbox) -> None:
        self._pool, self._sandbox, self._released = pool, sandbox, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)

    def close(self) -> None:
        if not self._released:
            self._released = True
            self._pool.release(self._sandbox)

    def discard(self) -> None:
        """Hand the sandbox back broken: the pool closes it (killing whatever still runs in
        it) and starts a fresh one. Idempotent; a later ``close()`` does nothing."""
        if not self._released:
            self._released = True
            self._pool.release(self._sandbox, broken=True)
