"""The asynchronous controller's pure bookkeeping: admission, the group buffer, and the
staleness check at consumption (no Ray, no engines; ``agentrl.driver.stream_source``
drives it).

Versions. The trainer's policy version ``v`` counts its updates; the update that starts at
``v`` produces ``v + 1``. A training row's *staleness* is ``v - row_version``, with
``row_version`` the version of its oldest sampled token (``TokenBatch.policy_versions``);
``k = controller.max_staleness`` bounds it strictly (docs/design.md, invariant 9).

Admission (AReaL's rule, Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement
Learning System for Language Reasoning", section 4): at most ``(k + 1) * B`` groups are
admitted and not yet trained, ``B`` = ``env.tasks_per_iteration``; the groups an update
consumes (trained, filtered out or dropped) keep their slots until that update's weights are
live (``release``), since a group admitted while the update at ``v`` runs is admitted at
``v`` but trained at ``v + 1`` at the earliest; groups it consumes without training them
(stale, or filtered out by dynamic sampling) free theirs at once (``unhold``), so that their
replacements can come. With ``k = 0`` nothing is admitted during an
update (the synchronous schedule); with ``k = 1`` one update's worth is. A group admitted at
version ``a`` samples nothing older than ``a``. A group that would be older than ``k`` at the
next update (admitted at ``a <= v - k``) *must* be in the update at ``v``, which waits for it
to complete; it is trained at staleness ``<= k``. So no row reaches the loss older than ``k``
unless something broke the rule (a bug, an engine that reported an old version):
``split_stale`` catches those at consumption, and the controller drops them (counted,
``async/stale_dropped``) and re-issues their task instance with ``attempt + 1``, so nothing is
lost and nothing is biased toward short episodes.

Groups are complete when every member has a finished (non-aborted) episode; an engine lost
mid-episode gives an aborted episode (kept with the group, stored, never scored) and a retry
request for the same member.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from agentrl.errors import ContractError
from agentrl.types import Episode, EpisodeRequest, TerminationReason


def episode_oldest_version(episode: Episode) -> int | None:
    """The policy version of the episode's oldest sampled token (``Turn.policy_version`` is the
    version of a turn's first sampled token, the turn's lowest); None without turns."""
    versions = [t.policy_version for t in episode.turns if t.completion_ids]
    return min(versions) if versions else None


@dataclass
class AdmittedGroup:
    """One task instance's group, admitted at ``admitted_version``.

    ``requests``: the current attempt of each member, by position; ``finished``: position ->
    its finished episode; ``aborted``: aborted attempts (an engine lost), stored, never scored.
    ``seq``: admission order (the oldest first when an update picks groups).
    """

    group_id: str
    requests: list[EpisodeRequest]
    admitted_version: int
    seq: int
    finished: dict[int, Episode] = field(default_factory=dict)
    aborted: list[Episode] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.finished) == len(self.requests)

    def unfinished_requests(self) -> list[EpisodeRequest]:
        return [r for p, r in enumerate(self.requests) if p not in self.finished]

    def episodes(self) -> list[Episode]:
        """Aborted attempts first, then the finished members in position order."""
        return list(self.aborted) + [self.finished[p] for p in sorted(self.finished)]

    def oldest_version(self) -> int | None:
        vs = [v for v in (episode_oldest_version(e) for e in self.finished.values()) if v is not None]
        return min(vs) if vs else None


class GroupBuffer:
    """Admitted groups from admission to consumption (module docstring).

    Args:
        groups_per_update: ``B`` (``env.tasks_per_iteration``), ``>= 1``.
        max_staleness: ``k`` (``controller.max_staleness``), ``>= 0``.

    Raises:
        ContractError: a bad ``B`` or ``k``; an episode or retry for a request the buffer
            does not hold; a group admitted twice while it is held.
    """

    def __init__(self, groups_per_update: int, max_staleness: int) -> None:
        if groups_per_update < 1 or max_staleness < 0:
            raise ContractError(f"GroupBuffer(groups_per_update={groups_per_update}, max_staleness={max_staleness}); "
                                "expected B >= 1 and k >= 0")
        self.groups_per_update = groups_per_update
        self.max_staleness = max_staleness
        self.capacity = (max_staleness + 1) * groups_per_update
        self.groups: dict[str, AdmittedGroup] = {}  # insertion order == admission order
        self.pending: deque[list[EpisodeRequest]] = deque()  # groups waiting for a slot, re-issued ones first
        self._where: dict[str, tuple[AdmittedGroup, int]] = {}  # episode id of a current attempt -> (group, position)
        self._seq = 0
        self.in_update = 0  # groups taken by the running update: their slots free at release()

    # -- admission -----------------------------------------------------------------
    def queue(self, group_requests: Sequence[EpisodeRequest], *, front: bool = False) -> None:
        """Queue one group's requests (same ``group_id``) for admission; ``front``: before
        every queued group (re-issued and resumed groups go first)."""
        reqs = list(group_requests)
        if not reqs or len({r.group_id for r in reqs}) != 1:
            raise ContractError(f"GroupBuffer.queue: expected the requests of one group, got group ids "
                                f"{sorted({r.group_id for r in reqs})}")
        (self.pending.appendleft if front else self.pending.append)(reqs)

    def free_slots(self) -> int:
        """Groups that may still be admitted now: ``(k + 1) * B`` minus those held and those
        the running update took."""
        return max(0, self.capacity - len(self.groups) - self.in_update)

    def unhold(self, n: int) -> None:
        """``n`` of the groups the running update took will not be trained (dropped as stale,
        or filtered out by dynamic sampling): their slots free up now, so their replacements
        (and a stale group's re-issue) can be admitted."""
        self.in_update = max(0, self.in_update - int(n))

    def release(self) -> None:
        """The update's weights are live (or it trained nothing): the slots of the groups it
        took free up."""
        self.in_update = 0

    def admit(self, version: int) -> list[EpisodeRequest]:
        """Admit queued groups while a slot is free, at policy version ``version``; returns
        their requests (to submit to the engines), in order."""
        out: list[EpisodeRequest] = []
        while self.pending and self.free_slots() > 0:
            reqs = self.pending.popleft()
            gid = reqs[0].group_id
            if gid in self.groups:
                raise ContractError(f"group {gid!r} admitted twice (it is still held, admitted at version "
                                    f"{self.groups[gid].admitted_version})")
            g = AdmittedGroup(gid, reqs, version, self._seq)
            self._seq += 1
            self.groups[gid] = g
            for p, r in enumerate(reqs):
                self._where[r.episode_id] = (g, p)
            out.extend(reqs)
        return out

    # -- episodes --------------------------------------------------------------------
    def add_episode(self, episode: Episode) -> AdmittedGroup:
        """File a finished or aborted episode with its group; returns the group."""
        hit = self._where.get(episode.episode_id)
        if hit is None:
            raise ContractError(f"episode {episode.episode_id!r} (group {episode.group_id!r}) is not an admitted "
                                "request's current attempt")
        g, p = hit
        if episode.termination_reason == TerminationReason.ABORTED:
            g.aborted.append(episode)  # the retry comes through add_retry
        else:
            del self._where[episode.episode_id]
            g.finished[p] = episode
        return g

    def add_retry(self, aborted_episode_id: str, retry: EpisodeRequest) -> None:
        """``retry`` (``attempt + 1``) replaces the aborted attempt ``aborted_episode_id``."""
        hit = self._where.pop(aborted_episode_id, None)
        if hit is None:
            raise ContractError(f"retry for {aborted_episode_id!r}, which is not an admitted request's current attempt")
        g, p = hit
        g.requests[p] = retry
        self._where[retry.episode_id] = (g, p)

    # -- consumption -------------------------------------------------------------------
    def must_include(self, version: int) -> list[AdmittedGroup]:
        """Held groups that would be older than ``k`` at the next update (admitted at a version
        ``< version + 1 - k``): the update starting at ``version`` must consume them."""
        return [g for g in self.groups.values() if g.admitted_version < version + 1 - self.max_staleness]

    def complete_groups(self) -> list[AdmittedGroup]:
        return [g for g in self.groups.values() if g.complete]

    def ready(self, version: int, wanted: int) -> bool:
        """An update at ``version`` wanting ``wanted`` groups can take them now: every
        must-include group is complete and at least ``wanted`` groups are."""
        return all(g.complete for g in self.must_include(version)) and len(self.complete_groups()) >= wanted

    def take(self, version: int, wanted: int) -> list[AdmittedGroup]:
        """Consume the groups of an update at ``version`` (call once ``ready``): the
        must-include groups, then the oldest complete ones, ``max(wanted, must-include)`` in
        all, in admission order. They leave the buffer; their slots stay taken until
        ``release``.

        Raises:
            ContractError: not ``ready``.
        """
        if not self.ready(version, wanted):
            raise ContractError(f"GroupBuffer.take(version={version}, wanted={wanted}) before it is ready "
                                f"({len(self.complete_groups())} complete, must include "
                                f"{[g.group_id for g in self.must_include(version)]})")
        must = self.must_include(version)
        chosen = {g.group_id for g in must}
        for g in self.complete_groups():
            if len(chosen) >= wanted:
                break
            chosen.add(g.group_id)
        out = [g for g in self.groups.values() if g.group_id in chosen]
        for g in out:
            del self.groups[g.group_id]
        self.in_update += len(out)
        return out

    def in_flight(self) -> int:
        """Requests admitted and not finished (on the engines or waiting to be)."""
        return sum(len(g.requests) - len(g.finished) for g in self.groups.values())

    def held_requests(self) -> list[EpisodeRequest]:
        """Every admitted-but-unconsumed request (current attempts) then every queued one, in
        admission / queue order: what a lossless checkpoint records."""
        out = [r for g in self.groups.values() for r in g.requests]
        out.extend(r for reqs in self.pending for r in reqs)
        return out


def split_stale(groups: Iterable[AdmittedGroup], version: int, max_staleness: int
                ) -> tuple[list[AdmittedGroup], list[AdmittedGroup]]:
    """``(fresh, stale)``: a group is stale when any member's oldest sampled token is more than
    ``max_staleness`` versions behind ``version`` (the whole group goes: its advantages are
    relative to its members)."""
    fresh, stale = [], []
    for g in groups:
        old = g.oldest_version()
        (stale if old is not None and version - old > max_staleness else fresh).append(g)
    return fresh, stale


def staleness_metrics(row_versions: Sequence[int], version: int) -> dict[str, float]:
    """``async/staleness_mean``, ``async/staleness_max`` and ``async/staleness_hist/<d>`` (trained
    rows of staleness ``d``) of the rows with oldest-token versions ``row_versions`` ``[R]``
    trained at ``version``. No rows: mean and max 0, no histogram keys.

    Raises:
        ContractError: a row newer than ``version`` (negative staleness: a version went backwards).
    """
    ds = [version - int(v) for v in row_versions]
    if any(d < 0 for d in ds):
        raise ContractError(f"rows with policy versions {sorted(set(int(v) for v in row_versions))} trained at "
                            f"version {version}: a row is newer than the trainer")
    m: dict[str, float] = {"async/staleness_mean": (sum(ds) / len(ds)) if ds else 0.0,
                           "async/staleness_max": float(max(ds)) if ds else 0.0}
    for d in sorted(set(ds)):
        m[f"async/staleness_hist/{d}"] = float(ds.count(d))
    return m


__all__ = ["AdmittedGroup", "GroupBuffer", "episode_oldest_version", "split_stale", "staleness_metrics"]
