"""What ``agentrl diagnose`` reads of a run: per-iteration metrics and one small record per
stored episode, through the read functions of ``agentrl.replay.read`` (``list_runs``,
``metrics``, ``list_episodes``, ``get_episode``, ``trainer_values``). Nothing here writes.

Final answers are normalised so that two samples that say the same thing compare equal
(``agentrl.replay.diagnose.answers.normalize_answer``: the last ``\\boxed{...}`` read with
brace matching, else what follows the last ``answer:``, else the last number).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentrl.errors import ContractError
from agentrl.replay import read
from agentrl.replay.diagnose.answers import normalize_answer
from agentrl.replay.read import ReplayDB
from agentrl.replay.store import ReplayStore
from agentrl.types import JudgeRecord, TerminationReason

MAX_EPISODES = 20_000
"""Most episodes read per run (the newest iterations' first). Each one is one read of its
turns; 20k episodes take about a minute on SQLite, and a diagnosis needs far fewer."""


@dataclass(frozen=True)
class JudgeFacts:
    """An episode's judgement (``JudgeRecord``, table ``judgements``) without its prompt,
    output and reasons: what ``agentrl.replay.diagnose.judge`` checks. ``score`` in [0, 1]
    (``None``: no judgement); ``rule_reward``: the env's rule reward (``None``: none);
    ``reward``: the combined reward (``None``: a reward error); ``latency_s``: seconds of the
    judge call (0 when ``cached`` or not ``judged``); ``judged``: False when the rule decided
    alone (``rule_first``); ``group_position``: the episode's id in a group call (``mode``
    ``group``), else ``None``."""

    model: str
    mode: str
    score: float | None
    rule_reward: float | None
    reward: float | None
    latency_s: float
    cached: bool
    judged: bool
    calls: int
    parse_errors: int
    group_position: int | None
    error: str | None

    @classmethod
    def of(cls, r: JudgeRecord) -> JudgeFacts:
        return cls(r.model, r.mode, r.score, r.rule_reward, r.reward, r.latency_s, r.cached, r.judged, r.calls,
                   r.parse_errors, r.group_position, r.error)


@dataclass(frozen=True)
class EpisodeFacts:
    """One stored episode, reduced to what the checks use.

    ``reward``: total reward, ``None`` when errored or unscored (never 0). ``success``: the
    env's flag, else ``reward >= 1`` (``Episode.success``'s rule), ``None`` when unscored.
    ``answer``: the last turn's action, normalised. ``response_tokens`` / ``response_chars``:
    summed over turns. ``lag``: policy versions between the oldest token and the version the
    update that trained it started from (``None``: not trained or unknown). ``gap_abs_mean``:
    mean |trainer log-prob - behavior log-prob| (nats) over its trained tokens, ``None`` when
    the store has no trainer values for it. ``entropy_mean``: the trainer's mean token entropy
    (nats), likewise. ``last_action_chars``: length of the last turn's action text, stripped
    (``answer`` is extracted from it; a long one is a program or an explanation, not an answer).
    ``judge``: its judgement (``JudgeFacts``), ``None`` without one (no judge, or a database of
    schema 9 or older, which has no ``judgements`` table).
    """

    episode_id: str
    iteration: int
    group_id: str
    env_id: str
    task_id: str
    kind: str
    reward: float | None
    success: bool | None
    termination: TerminationReason | None
    num_turns: int
    response_tokens: int
    response_chars: int
    finish_reasons: tuple[str, ...]
    tool_calls: int
    answer: str
    trained: bool
    policy_version_min: int | None
    lag: int | None = None
    gap_abs_mean: float | None = None
    entropy_mean: float | None = None
    last_action_chars: int = 0
    judge: JudgeFacts | None = None

    @property
    def scored(self) -> bool:
        return self.reward is not None

    @property
    def truncated_by_length(self) -> bool:
        return self.termination == TerminationReason.LENGTH or (bool(self.finish_reasons)
                                                                  and self.finish_reasons[-1] == "length")


@dataclass
class RunData:
    """A run as the checks see it. ``metrics``: ``{iteration: {key: value}}`` (the store's,
    iterations from 1, 0 for what precedes training); ``episodes``: in insertion order; ``truncated``: more than
    ``MAX_EPISODES`` were stored and the oldest were left out."""

    run_id: str
    metrics: dict[int, dict[str, float]]
    episodes: list[EpisodeFacts] = field(default_factory=list)
    truncated: bool = False
    config: dict = field(default_factory=dict)

    def series(self, key: str) -> list[tuple[int, float]]:
        """``[(iteration, value)]`` of one metric where it is finite, iterations ascending."""
        return [(it, m[key]) for it, m in sorted(self.metrics.items())
                if key in m and m[key] is not None and math.isfinite(m[key])]


RunSource = ReplayDB | ReplayStore
"""What a run is read from: a read handle (the viewer's ``ReadOnlyDB``) or a store, whose
``ReplayStore.db`` is read."""


def _trainer_stats(db: ReplayDB, episode_id: str, behavior: list[list[float]]) -> tuple[float | None, float | None]:
    gaps: list[float] = []
    ents: list[float] = []
    for (lps, entropies), blps in zip(read.trainer_values(db, episode_id) or [], behavior):
        if lps is not None:
            gaps.extend(abs(a - b) for a, b in zip(lps, blps))
        if entropies is not None:
            ents.extend(entropies)
    return (sum(gaps) / len(gaps) if gaps else None), (sum(ents) / len(ents) if ents else None)


def load_run(source: RunSource, run_id: str, *, max_episodes: int = MAX_EPISODES) -> RunData:
    """Read one run's metrics and episodes (see ``EpisodeFacts``) from ``source``.

    Raises:
        ContractError: ``run_id`` is not in the database (the message lists the runs there).
    """
    db = source.db if isinstance(source, ReplayStore) else source
    run = read.get_run(db, run_id)
    if run is None:
        known = [r.run_id for r in read.list_runs(db)]
        raise ContractError(f"run {run_id!r} is not in {db.url}; runs there: {', '.join(known) or 'none'}")
    metrics = read.metrics(db, run_id)
    # the version each iteration's update started from: the metric is the version after it
    start_version = {it: int(m["policy_version"]) - 1 for it, m in metrics.items()
                     if m.get("policy_version") is not None and math.isfinite(m["policy_version"])}
    total = read.count_episodes(db, run_id)
    offset = max(0, total - max_episodes)
    data = RunData(run_id, metrics, truncated=offset > 0, config=run.config)
    while offset < total:
        page = read.list_episodes(db, run_id, limit=1000, offset=offset)
        if not page:
            break
        offset += len(page)
        for s in page:
            ep = read.get_episode(db, s.episode_id)
            if ep is None:  # deleted after its page was read (a rewind by a resuming run)
                continue
            turns = ep.turns
            success = ep.success if ep.success is not None else (
                None if s.total_reward is None else s.total_reward >= 1.0)
            trained = s.advantage_mean is not None
            lag = None
            if trained and s.policy_version_min is not None and s.iteration in start_version:
                lag = max(0, start_version[s.iteration] - s.policy_version_min)
            gap, ent = _trainer_stats(db, s.episode_id, [t.behavior_log_probs for t in turns])
            data.episodes.append(EpisodeFacts(
                episode_id=s.episode_id, iteration=s.iteration, group_id=s.group_id, env_id=s.env_id,
                task_id=s.task_id, kind=s.kind, reward=s.total_reward, success=success if s.total_reward is not None else None,
                termination=s.termination_reason, num_turns=s.num_turns, response_tokens=s.num_generated_tokens,
                response_chars=sum(len(t.action_text) for t in turns),
                finish_reasons=tuple(t.finish_reason for t in turns),
                tool_calls=sum(len(t.exec_results) for t in turns),
                answer=normalize_answer(turns[-1].action_text) if turns else "",
                trained=trained, policy_version_min=s.policy_version_min, lag=lag,
                gap_abs_mean=gap, entropy_mean=ent,
                last_action_chars=len(turns[-1].action_text.strip()) if turns else 0,
                judge=None if ep.judgement is None else JudgeFacts.of(ep.judgement)))
    return data


def metric_keys(metrics: Mapping[int, Mapping[str, float]], prefix: str) -> list[str]:
    """Sorted metric keys starting with ``prefix`` over all iterations."""
    return sorted({k for m in metrics.values() for k in m if k.startswith(prefix)})


__all__ = ["EpisodeFacts", "JudgeFacts", "MAX_EPISODES", "RunData", "load_run", "metric_keys", "normalize_answer"]
