"""TaskSource: which task instances each iteration rolls out, resumable from a cursor.

Order: epoch ``e`` visits the split's task ids in a permutation drawn from
``numpy.random.default_rng([seed, e])``; an iteration takes the next
``tasks_per_iteration`` ids, crossing into the next epoch when one runs out. The state is
one integer (``cursor`` = tasks handed out so far), saved in every checkpoint, so a
resumed run continues with exactly the tasks an uninterrupted run would have seen, and no
batch is repeated or skipped, on an epoch boundary too (docs/cases.md, C11).

Episode ids: every request carries the run id, the iteration the controller set
(``TaskSource.iteration``: numbered from 1, as everywhere a user sees an iteration; 0,
``BEFORE_TRAINING``, for what precedes iteration 1, such as an eval before training), its
index in the group and ``attempt=0``, so its ``EpisodeRequest.episode_id`` is
``"{run_id}/it{iteration}/{task_id}@{position}/{index}/a0"`` (``/it1/`` for the first
iteration).
A resumed run re-issues the same requests for a re-run iteration (same cursor), so the re-run
episodes keep their ids; dynamic-sampling refills take new positions, so their ids differ.

Pending requests (``controller.mode: async``). The asynchronous controller has requests
admitted but not yet trained (in flight, or finished and buffered) at a checkpoint; the
cursor has already moved past them. ``requests_state`` / ``requests_from_state`` write them
into the checkpoint and read them back, so a resume re-issues exactly those requests (same
episode ids) before the cursor's next ones; ``retry_requests`` re-issues a task instance
whose rows were dropped (``attempt + 1``: new episode ids, same sampling seeds).

Skipped tasks (``env.difficulty_filter``, ``agentrl.driver.difficulty``). ``set_skip`` names
task ids to pass over: ``next_requests`` then walks the same permutation positions as
always but hands out only the positions whose task is not skipped, and the cursor moves past
the skipped ones too (so positions, env seeds, group ids and episode ids stay those of the
unfiltered order). The skip set and the profile it came from (policy version, iteration) are
part of ``state_dict``, so a resumed run skips exactly what the uninterrupted run skipped
(``iteration``: the iteration the profile was made before, from 1).
Without a skip set (the filter off) the order and ``state_dict`` are exactly as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Iterable, Sequence

import numpy as np

from agentrl.errors import CheckpointError, ConfigError
from agentrl.types import EpisodeRequest

BEFORE_TRAINING = 0
"""The iteration number of what precedes iteration 1 (docs/design.md, "Iteration numbering"):
the eval of the starting policy (``eval.before_training``, ids ``{run_id}/eval-before/it0/...``)
and ``agentrl eval``'s rows in the replay store. Training iterations are 1, 2, ..."""


@dataclass(frozen=True)
class SkipSet:
    """The tasks a difficulty profile chose to pass over, and which profile chose them.

    Attributes:
        task_ids: the skipped task ids, sorted.
        policy_version: the policy version the profile measured.
        iteration: the iteration the profile was made before (from 1).
    """

    task_ids: tuple[str, ...]
    policy_version: int
    iteration: int

    STATE_KEYS = frozenset({"skip_task_ids", "policy_version", "iteration"})

    def to_state(self) -> dict[str, Any]:
        """The checkpoint's record: ``{"skip_task_ids": [...], "policy_version": v, "iteration": i}``."""
        return {"skip_task_ids": list(self.task_ids), "policy_version": self.policy_version,
                "iteration": self.iteration}


@dataclass
class TaskSource:
    """Deterministic, resumable task order.

    Args:
        env_id: gymnasium id of the environment.
        task_ids: the split's task ids (non-empty, unique).
        seed: run seed.
        group_size: rollouts per task instance (one ``group_id`` each).
        cursor: tasks handed out so far (0 for a new run).
        run_id: the run the requests belong to (part of each episode id; ``""`` outside a run).
        iteration: the iteration the next requests are for (1 for the first;
            ``BEFORE_TRAINING`` before it); the controller sets it at the start of each
            iteration (refills within one iteration share it). Not part of
            ``state_dict``: the checkpoint's iteration says where a resume starts.

    ``skip`` (read-only; ``set_skip`` changes it): ``None`` when no skip set was ever given
    (the filter off), else a ``SkipSet``.
    """

    env_id: str
    task_ids: Sequence[str]
    seed: int
    group_size: int
    cursor: int = 0
    run_id: str = ""
    iteration: int = 0

    def __post_init__(self) -> None:
        if not self.task_ids:
            raise ConfigError(f"environment {self.env_id!r} has no tasks in the chosen split")
        if len(set(self.task_ids)) != len(self.task_ids):
            raise ConfigError(f"environment {self.env_id!r} lists duplicate task ids")
        self.task_ids = list(self.task_ids)
        self._perm_cache: dict[int, np.ndarray] = {}
        self._skip: frozenset[str] = frozenset()
        self.skip: SkipSet | None = None

    def set_skip(self, task_ids: Iterable[str], *, policy_version: int, iteration: int) -> None:
        """Pass over ``task_ids`` from the next request on (module docstring); ``policy_version``
        and ``iteration`` record which profile chose them (checkpointed with the set).

        Raises:
            ConfigError: a task id not in the split, or a set that skips every task (nothing
                left to hand out).
        """
        skip = frozenset(task_ids)
        unknown = sorted(skip - set(self.task_ids))
        if unknown:
            raise ConfigError(f"skip set names tasks {unknown[:5]} that are not in {self.env_id!r}'s task list")
        if len(skip) == len(self.task_ids):
            raise ConfigError(f"skip set names all {len(skip)} tasks of {self.env_id!r}: no task left to roll out")
        self._skip = skip
        self.skip = SkipSet(tuple(sorted(skip)), int(policy_version), int(iteration))

    def clear_skip(self) -> None:
        """Drop the skip set (the filter turned off on a resume): from the next request on the
        order, and ``state_dict``, are the unfiltered ones again."""
        self._skip, self.skip = frozenset(), None

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm_cache:
            self._perm_cache = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.task_ids))}
        return self._perm_cache[epoch]

    def task_at(self, position: int) -> tuple[str, int]:
        """(task id, epoch) of the ``position``-th task handed out."""
        n = len(self.task_ids)
        epoch, k = divmod(position, n)
        return self.task_ids[int(self._perm(epoch)[k])], epoch

    def next_requests(self, num_tasks: int) -> list[EpisodeRequest]:
        """The next ``num_tasks`` task instances × ``group_size`` rollouts; advances the cursor.

        Group ids are ``"{task_id}@{position}"``: unique per task instance, shared by its
        rollouts. The env seed is the instance's position (same task, new instance, new
        seed); sampling seeds differ per rollout. Each request carries ``run_id``,
        ``iteration``, its ``index`` in the group and ``attempt=0`` (see the module docstring).
        Positions whose task is in the skip set are passed over (the cursor moves past them).
        """
        out: list[EpisodeRequest] = []
        pos, taken = self.cursor, 0
        while taken < num_tasks:
            task_id, _epoch = self.task_at(pos)
            if task_id in self._skip:
                pos += 1
                continue
            group_id = f"{task_id}@{pos}"
            for g in range(self.group_size):
                out.append(EpisodeRequest(
                    env_id=self.env_id, task_id=task_id, seed=pos, group_id=group_id,
                    sample_seed=(self.seed * 1_000_003 + pos * 131 + g) % (2**31 - 1),
                    run_id=self.run_id, iteration=self.iteration, index=g, attempt=0,
                ))
            pos, taken = pos + 1, taken + 1
        self.cursor = pos
        return out

    def state_dict(self) -> dict:
        """``cursor``, ``seed``, ``num_tasks``, and ``skip`` once a skip set was given."""
        state: dict[str, Any] = {"cursor": self.cursor, "seed": self.seed, "num_tasks": len(self.task_ids)}
        if self.skip is not None:
            state["skip"] = self.skip.to_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (``state_dict``'s), skip set included.

        Raises:
            ConfigError: another seed or task count than this run's.
            CheckpointError: a malformed skip record.
        """
        if state.get("seed") != self.seed or state.get("num_tasks") != len(self.task_ids):
            raise ConfigError(
                f"checkpoint's task source (seed={state.get('seed')}, {state.get('num_tasks')} tasks) does not "
                f"match this run (seed={self.seed}, {len(self.task_ids)} tasks)"
            )
        self.cursor = int(state["cursor"])
        skip = state.get("skip")
        if skip is None:
            self._skip, self.skip = frozenset(), None
            return
        if not isinstance(skip, dict) or set(skip) != SkipSet.STATE_KEYS:
            raise CheckpointError(f"checkpoint's task skip record {skip!r}: expected the keys skip_task_ids, "
                                  "policy_version, iteration")
        try:
            self.set_skip(skip["skip_task_ids"], policy_version=skip["policy_version"], iteration=skip["iteration"])
        except ConfigError as exc:
            raise CheckpointError(f"checkpoint's task skip record: {exc}") from None


_REQUEST_FIELDS = tuple(f.name for f in fields(EpisodeRequest))


def requests_state(requests: Sequence[EpisodeRequest]) -> list[dict[str, Any]]:
    """``requests`` as JSON-serializable dicts (one per request, every ``EpisodeRequest``
    field), for a checkpoint's controller state."""
    return [asdict(r) for r in requests]


def requests_from_state(state: Sequence[Any]) -> list[EpisodeRequest]:
    """The requests ``requests_state`` wrote, in order.

    Raises:
        CheckpointError: an entry that is not a dict of exactly the ``EpisodeRequest`` fields.
    """
    out = []
    for k, d in enumerate(state):
        if not isinstance(d, dict) or set(d) != set(_REQUEST_FIELDS):
            got = sorted(d) if isinstance(d, dict) else type(d).__name__
            raise CheckpointError(f"checkpoint's pending request {k}: got {got}; expected the fields {list(_REQUEST_FIELDS)}")
        out.append(EpisodeRequest(**d))
    return out


def retry_requests(requests: Sequence[EpisodeRequest], iteration: int | None = None) -> list[EpisodeRequest]:
    """The same task instance again: each request with ``attempt + 1`` (a new episode id, the
    same group id and sampling seed), and ``iteration`` when given (the iteration that
    re-issues it)."""
    return [replace(r, attempt=r.attempt + 1, **({} if iteration is None else {"iteration": iteration})) for r in requests]
