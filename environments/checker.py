"""``check_env``: does an environment keep the contract the agent loop relies on?

The agent loop (``agentrl.rollout.loop``) expects of an env: ``reset(seed=,
options={"task_id": ...})`` -> ``(str, dict)``; ``step(str)`` -> ``(str, finite float,
bool, bool, dict)``; a hashable ``info["anchor"]`` (GiGPO's state key); ``step`` after the
episode ended raises ``EnvError``; a classmethod ``task_ids(split)``. This checker runs an
env through that contract, in the spirit of Gymnasium's ``utils/env_checker.py`` but for
text envs with an injected sandbox (it never deep-copies the make kwargs, so a sandbox that
cannot be copied is fine).

Checks, in order (each failure is one ``CheckProblem`` naming the check and what to fix):

``make``        the env can be made with a sandbox from ``sandbox_factory``.
``task_ids``    ``task_ids(split)`` is a classmethod returning a non-empty list of str (given
                the env kwargs where it accepts them: ``task_ids_of``).
``reset``       return types; ``info`` passes ``agentrl.types.StepInfo.from_info`` (the
                validator the rollout loop uses: known ``observation_role``,
                ``tool_outputs`` a list of str, typed ``system_prompt``, each ``tools``
                schema passing ``agentrl.types.tool_function``, bool flags, numpy's
                included).
``anchor``      every ``info["anchor"]`` is hashable.
``step``        return types, finite reward, bool flags, ``info`` as for ``reset``.
``done``        after ``terminated or truncated``, ``step`` raises ``EnvError``.
``determinism`` ``reset`` with the same seed and task gives the same observation and
                anchor, also after steps ran; the scripted trajectory repeats exactly.
``independence`` two instances reset with the same seed and stepped alternately give the
                trajectory one instance gives alone (no shared random state).
``close``       ``close()`` works twice, releases the file descriptors, threads and child
                processes the env opened (measured in this process; what the class's
                instances share, a server or a worker, after its ``release_shared()``
                classmethod where it has one), and the caller-owned sandbox can be closed
                afterwards.

The actions come from ``scripted_actions``, else the env class's ``checker_actions()``
(a classmethod returning a list of str, or a dict ``task_id -> list``), else a generic
pair of replies. They should end the episode; if they do not, the ``done`` check is
skipped and reported as a note.
"""

from __future__ import annotations

import inspect
import math
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Sequence

from agentrl.errors import EnvError
from agentrl.types import OBSERVATION_ROLES, StepInfo, StepInfoError
from environments.core import DEFAULT_CHECKER_ACTIONS
from environments.registry import env_class, make_env

__all__ = ["CheckProblem", "CheckReport", "EnvCheckError", "check_env", "format_report", "task_ids_of",
           "OBSERVATION_ROLES"]

DEFAULT_ACTIONS = DEFAULT_CHECKER_ACTIONS
LEAK_WAIT_S = 5.0
"""Seconds the close check waits for the threads and child processes an env stopped to go."""


def task_ids_of(fn: Callable[..., Any], split: str, env_kwargs: Mapping[str, Any] | None = None) -> Any:
    """``fn(split, env_kwargs=dict(env_kwargs))`` when ``fn`` (an env class's ``task_ids``) has
    a parameter named ``env_kwargs`` (tasks that depend on the kwargs: ``hub/ReasoningGym-v0``),
    else ``fn(split)`` (a bare ``**kwargs`` is not one: a wrapper forwarding to a
    ``task_ids(split)`` would pass them on). Returns what ``fn`` returns; its errors propagate."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): the plain call
        return fn(split)
    if "env_kwargs" in params and params["env_kwargs"].kind is not inspect.Parameter.VAR_KEYWORD:
        return fn(split, env_kwargs=dict(env_kwargs or {}))
    return fn(split)


class EnvCheckError(EnvError):
    """An environment failed ``check_env``; ``.report`` holds the full ``CheckReport``."""

    def __init__(self, report: "CheckReport") -> None:
        super().__init__(format_report(report))
        self.report = report


@dataclass(frozen=True)
class CheckProblem:
    """One failed check: ``check`` is its name (see the module docstring), ``message`` says
    what was observed and what was expected."""

    check: str
    message: str


@dataclass
class CheckReport:
    """What ``check_env`` found.

    Attributes:
        env_id: the checked id.
        task_id: the task the episodes ran on.
        seed: the reset seed used.
        problems: failed checks (empty: the env passes).
        checks_passed: names of checks that ran and passed.
        notes: things not checked and why (e.g. the actions did not end the episode).
        steps: number of steps of the scripted trajectory.
    """

    env_id: str
    task_id: str | None = None
    seed: int = 0
    problems: list[CheckProblem] = field(default_factory=list)
    checks_passed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    steps: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self) -> None:
        """Raise ``EnvCheckError`` (an ``EnvError``) when any check failed."""
        if self.problems:
            raise EnvCheckError(self)


def format_report(report: CheckReport) -> str:
    """The report as plain text, one line per check (for ``agentrl envs check``)."""
    verdict = "PASS" if report.ok else f"FAIL ({len(report.problems)} problem(s))"
    lines = [f"{report.env_id}: {verdict}  [task {report.task_id}, seed {report.seed}, {report.steps} step(s)]"]
    for name in report.checks_passed:
        lines.append(f"  ok    {name}")
    for p in report.problems:
        lines.append(f"  FAIL  {p.check}: {p.message}")
    for note in report.notes:
        lines.append(f"  note  {note}")
    return "\n".join(lines)


class _Failed(Exception):
    """Internal: a check failed so badly that the checks after it cannot run."""


# -- resource accounting ---------------------------------------------------------------


def _fds() -> dict[int, str]:
    out = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # not Linux: fds are not checked
        return out
    for name in names:
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return out


def _children() -> set[int]:
    pid = os.getpid()
    kids: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    kids.update(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return kids


@dataclass(frozen=True)
class _Resources:
    fds: dict[int, str]
    threads: frozenset[int]
    children: frozenset[int]

    @classmethod
    def now(cls) -> "_Resources":
        return cls(_fds(), frozenset(t.ident for t in threading.enumerate() if t.ident), frozenset(_children()))

    def leaked_since(self, before: "_Resources") -> list[str]:
        leaks = []
        new_fds = {fd: tgt for fd, tgt in self.fds.items() if before.fds.get(fd) != tgt}
        if new_fds:
            leaks.append(f"{len(new_fds)} file descriptor(s) still open: " + ", ".join(f"{fd}->{t}" for fd, t in sorted(new_fds.items())[:5]))
        threads = [t for t in threading.enumerate() if t.ident in self.threads - before.threads and t.is_alive()]
        if threads:
            leaks.append(f"{len(threads)} thread(s) still running: " + ", ".join(t.name for t in threads[:5]))
        kids = self.children - before.children
        alive = sorted(p for p in kids if os.path.exists(f"/proc/{p}") and not _is_zombie(p))
        if alive:
            leaks.append(f"{len(alive)} child process(es) still running: pids {alive[:5]}")
        return leaks


def _leaks_since(before: _Resources, wait_s: float = LEAK_WAIT_S) -> list[str]:
    """``leaked_since(before)``, measured again until nothing is left or ``wait_s`` passed
    (a stopped thread or child process takes a moment to go)."""
    deadline = time.monotonic() + wait_s
    while True:
        leaks = _Resources.now().leaked_since(before)
        if not leaks or time.monotonic() >= deadline:
            return leaks
        time.sleep(0.1)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# -- the checker -------------------------------------------------------------------------


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Checker:
    def __init__(self, env_id: str, sandbox_factory: Callable[[], Any] | None, actions: Sequence[str] | None,
                 seed: int, task_id: str | None, split: str, env_kwargs: dict[str, Any]) -> None:
        self.report = CheckReport(env_id=env_id, seed=seed)
        self.env_id = env_id
        self.sandbox_factory = sandbox_factory
        self.scripted = list(actions) if actions is not None else None
        self.seed = seed
        self.task_id = task_id
        self.split = split
        self.env_kwargs = env_kwargs
        self.sandboxes: list[Any] = []
        self.envs: list[Any] = []
        self.cls: Any = None
        self._failed: set[str] = set()

    def fail(self, check: str, message: str) -> None:
        self._failed.add(check)
        self.report.problems.append(CheckProblem(check, message))

    def passed(self, check: str) -> None:
        if check not in self._failed and check not in self.report.checks_passed:
            self.report.checks_passed.append(check)

    # making ---------------------------------------------------------------------------

    def make(self) -> Any:
        sandbox = self.sandbox_factory() if self.sandbox_factory is not None else None
        if sandbox is not None:
            self.sandboxes.append(sandbox)
        try:
            env = make_env(self.env_id, sandbox=sandbox, **self.env_kwargs)
        except Exception as exc:
            self.fail("make", f"making the env raised {_describe(exc)}")
            raise _Failed from exc
        self.envs.append(env)
        return env

    def close_all(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass
        for sb in self.sandboxes:
            try:
                sb.close()
            except Exception:
                pass
        release = getattr(self.cls, "release_shared", None)
        if release is not None:
            try:
                release()
            except Exception:
                pass  # reported by the close check when it ran

    # contract of one call ---------------------------------------------------------------

    def check_info(self, check: str, where: str, info: dict) -> StepInfo | None:
        """``StepInfo.from_info`` (the validator the rollout uses); a failure is a problem
        of ``check`` (of ``anchor`` for the anchor key). None when it failed."""
        try:
            return StepInfo.from_info(info, env_id=self.env_id, where=where)
        except StepInfoError as exc:
            self.fail("anchor" if exc.key == "anchor" else check, str(exc))
            return None

    def reset(self, env: Any, seed: int | None) -> tuple[str, Hashable]:
        try:
            out = env.reset(seed=seed, options={"task_id": self.task_id})
        except Exception as exc:
            self.fail("reset", f"reset(seed={seed}, options={{'task_id': {self.task_id!r}}}) raised {_describe(exc)}")
            raise _Failed from exc
        if not (isinstance(out, tuple) and len(out) == 2):
            self.fail("reset", f"reset returned {type(out).__name__}; expected a tuple (observation: str, info: dict)")
            raise _Failed
        obs, info = out
        if not isinstance(obs, str):
            self.fail("reset", f"reset returned an observation of type {type(obs).__name__}; expected str")
        if not isinstance(info, dict):
            self.fail("reset", f"reset returned info of type {type(info).__name__}; expected dict")
            raise _Failed
        parsed = self.check_info("reset", "reset", info)
        anchor = parsed.anchor_or(obs) if parsed is not None else repr(info.get("anchor", obs))
        return obs, anchor

    def step(self, env: Any, action: str, k: int) -> tuple[str, float, bool, bool, Hashable]:
        try:
            out = env.step(action)
        except Exception as exc:
            self.fail("step", f"step {k} ({action!r:.60}) raised {_describe(exc)}")
            raise _Failed from exc
        if not (isinstance(out, tuple) and len(out) == 5):
            self.fail("step", f"step {k} returned {type(out).__name__}; expected (observation, reward, terminated, truncated, info)")
            raise _Failed
        obs, reward, terminated, truncated, info = out
        if not isinstance(obs, str):
            self.fail("step", f"step {k}: observation of type {type(obs).__name__}; expected str")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
            self.fail("step", f"step {k}: reward={reward!r}; expected a finite int or float")
            reward = float("nan")
        if not isinstance(terminated, bool) or not isinstance(truncated, bool):
            self.fail("step", f"step {k}: terminated={terminated!r}, truncated={truncated!r}; expected Python bools")
        if not isinstance(info, dict):
            self.fail("step", f"step {k}: info of type {type(info).__name__}; expected dict")
            raise _Failed
        parsed = self.check_info("step", f"step {k}", info)
        anchor = parsed.anchor_or(obs) if parsed is not None else repr(info.get("anchor", obs))
        return obs, float(reward), bool(terminated), bool(truncated), anchor

    def actions(self, cls: Any) -> list[str]:
        if self.scripted is not None:
            return self.scripted
        fn = getattr(cls, "checker_actions", None)
        if fn is None:
            self.report.notes.append(f"{getattr(cls, '__name__', cls)} declares no checker_actions(); used generic replies {list(DEFAULT_ACTIONS)}")
            return list(DEFAULT_ACTIONS)
        acts = fn()
        if isinstance(acts, dict):
            acts = acts.get(self.task_id, next(iter(acts.values()), []))
        if not (isinstance(acts, (list, tuple)) and all(isinstance(a, str) for a in acts)):
            self.fail("step", f"checker_actions() returned {acts!r:.80}; expected a list of str (or a dict task_id -> list of str)")
            return list(DEFAULT_ACTIONS)
        return list(acts)

    def trajectory(self, env: Any, actions: list[str]) -> tuple[list[tuple], bool]:
        """reset(seed) then the actions until done. Returns (records, done)."""
        records: list[tuple] = [("reset",) + self.reset(env, self.seed)]
        done = False
        for k, action in enumerate(actions):
            obs, r, term, trunc, anchor = self.step(env, action, k)
            records.append((obs, r, term, trunc, anchor))
            if term or trunc:
                done = True
                break
        return records, done

    # the run ---------------------------------------------------------------------------

    def run(self) -> CheckReport:
        try:
            cls = env_class(self.env_id)
        except Exception as exc:
            self.fail("make", _describe(exc))
            return self.report
        self.cls = cls
        try:
            self._run(cls)
        except _Failed:
            pass
        except Exception as exc:  # a bug the checks above did not classify
            self.fail("unexpected", f"{_describe(exc)}\n{traceback.format_exc(limit=3)}")
        finally:
            self.close_all()
        return self.report

    def _run(self, cls: Any) -> None:
        # task_ids
        fn = getattr(cls, "task_ids", None)
        if fn is None:
            self.fail("task_ids", f"{cls!r} has no classmethod task_ids(split); the task source needs it to list tasks")
        else:
            try:
                ids = task_ids_of(fn, self.split, self.env_kwargs)
            except Exception as exc:
                self.fail("task_ids", f"task_ids({self.split!r}) raised {_describe(exc)}")
                ids = []
            if not (isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids)):
                self.fail("task_ids", f"task_ids({self.split!r}) returned {ids!r:.80}; expected a non-empty list of str")
            else:
                self.passed("task_ids")
                if self.task_id is None:
                    self.task_id = ids[0]
        self.report.task_id = self.task_id
        actions = self.actions(cls)

        # make, measuring the resources the env opens (the sandbox's own are created first)
        sandbox = self.sandbox_factory() if self.sandbox_factory is not None else None
        if sandbox is not None:
            self.sandboxes.append(sandbox)
            try:
                sandbox.exec(["true"], timeout_s=30)  # warm-up: lazy backend state is not the env's
            except Exception as exc:
                self.fail("make", f"the sandbox from sandbox_factory does not run commands: {_describe(exc)}")
                raise _Failed from exc
        before = _Resources.now()

        try:
            env = make_env(self.env_id, sandbox=sandbox, **self.env_kwargs)
        except Exception as exc:
            self.fail("make", f"making the env raised {_describe(exc)}")
            raise _Failed from exc
        self.envs.append(env)
        self.passed("make")

        # determinism of reset, then the scripted trajectory
        first = self.reset(env, self.seed)
        again = self.reset(env, self.seed)
        if first != again:
            self.fail("determinism", f"reset(seed={self.seed}) twice on one instance gave different results: {first!r:.120} vs {again!r:.120}; derive all randomness from self.np_random / the seed")
        self.passed("reset")
        records, done = self.trajectory(env, actions)
        self.report.steps = len(records) - 1
        if records[0] != ("reset",) + first:
            self.fail("determinism", f"reset(seed={self.seed}) differs from the first reset: {records[0][1:]!r:.120} vs {first!r:.120}")
        if actions:  # none: an env that is never stepped (noted below), not a step check passed
            self.passed("step")

        # step after done
        if done:
            try:
                env.step(actions[-1] if actions else "")
            except EnvError:
                self.passed("done")
            except Exception as exc:
                self.fail("done", f"step after the episode ended raised {_describe(exc)}; expected agentrl.errors.EnvError")
            else:
                self.fail("done", "step after the episode ended (terminated or truncated) was accepted; it must raise agentrl.errors.EnvError")
        elif not actions:
            self.report.notes.append("no scripted actions (the class's checker_actions() is empty: an env that is never stepped): step and step-after-done not checked")
        else:
            self.report.notes.append(f"the {len(actions)} scripted action(s) did not end the episode: step-after-done not checked (declare checker_actions() that end it)")

        # the same trajectory again on the same instance (after steps ran)
        replay, _ = self.trajectory(env, actions)
        if replay != records:
            self.fail("determinism", f"the scripted trajectory with seed {self.seed} differs when repeated on the same instance: {_first_diff(records, replay)}")
        self.passed("determinism")

        # independence: a second instance, interleaved with the first
        other = self.make()
        a_recs = [("reset",) + self.reset(env, self.seed)]
        b_recs = [("reset",) + self.reset(other, self.seed)]
        for k, action in enumerate(actions[: len(records) - 1]):
            a_recs.append(self.step(env, action, k))
            b_recs.append(self.step(other, action, k))
        for name, recs in (("first", a_recs), ("second", b_recs)):
            if recs != records:
                self.fail("independence", f"two instances reset with seed {self.seed} and stepped alternately: the {name} one deviates from a lone run ({_first_diff(records, recs)}); instances must not share random state (no module-level RNG, no global random.seed)")
                break
        self.passed("independence")
        other.close()

        # close
        for attempt in (1, 2):
            try:
                env.close()
            except Exception as exc:
                self.fail("close", f"close() call {attempt} raised {_describe(exc)}; close must be idempotent")
        release = getattr(cls, "release_shared", None)
        if release is not None:  # what the class's instances share in this process (a server, a worker)
            try:
                release()
            except Exception as exc:
                self.fail("close", f"{getattr(cls, '__name__', cls)}.release_shared() raised {_describe(exc)}")
        leaks = _leaks_since(before)
        if leaks:
            self.fail("close", "resources not released after close(): " + "; ".join(leaks))
        if sandbox is not None:
            try:
                sandbox.close()
            except Exception as exc:
                self.fail("close", f"closing the caller-owned sandbox after env.close() raised {_describe(exc)}")
        self.passed("close")


def _first_diff(a: list[tuple], b: list[tuple]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            where = "reset" if i == 0 else f"step {i - 1}"
            return f"first difference at {where}: {x!r:.100} vs {y!r:.100}"
    return f"lengths differ: {len(a)} vs {len(b)} records"


def check_env(
    env_id: str,
    *,
    sandbox_factory: Callable[[], Any] | None = None,
    scripted_actions: Sequence[str] | None = None,
    seed: int = 0,
    task_id: str | None = None,
    split: str = "train",
    env_kwargs: dict[str, Any] | None = None,
) -> CheckReport:
    """Check that the env registered as ``env_id`` keeps the agent loop's contract.

    Args:
        env_id: a registered id (entry points are loaded first).
        sandbox_factory: called with no arguments for each instance's sandbox (the checker
            makes two instances and closes their sandboxes); ``None``: envs are made without
            a sandbox.
        scripted_actions: the completions to step with; default: the class's
            ``checker_actions()``, else generic replies.
        seed: the reset seed.
        task_id: the task to run; default: the first of ``task_ids(split)`` (with ``env_kwargs``
            where it accepts them: ``task_ids_of``).
        split: the split whose first task is used when ``task_id`` is None.
        env_kwargs: extra constructor keywords.

    Returns:
        A ``CheckReport``; ``report.ok`` is False when any check failed, and
        ``report.raise_if_failed()`` raises ``EnvCheckError`` (an ``agentrl.errors.EnvError``)
        with ``format_report``'s text. Never raises for the env's own failures.
    """
    return _Checker(env_id, sandbox_factory, scripted_actions, seed, task_id, split, dict(env_kwargs or {})).run()
