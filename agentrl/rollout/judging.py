"""Judge rewards in the rollout: each episode is handed to the run's judge as it ends, and
its reward is settled when the judgement comes back (``RolloutSession`` holds the episode
until then; its env and sandbox are closed at once).

The judge is any object with ``submit(episode, item) -> concurrent.futures.Future`` whose
result is a ``JudgeRecord`` (or, when its ``group_mode`` is true, ``submit_group(episodes,
items)`` whose result is their records: the session then holds each episode until every
request of its group submitted to it has finished, and hands the group over in one call) (``agentrl.rewards.scorer.EpisodeScorer`` is the run's: its
rubric, its judge client or judge service, the cache, how the judge's score and the rule's
reward combine). What the judge reads is a ``JudgeItem`` built here from the episode: the
task as the policy saw it, the env's reference answer (``StepInfo.reference_answer``), the
final answer (``StepInfo.final_answer``, else the last action's text), the transcript and
the sandbox outputs, and the rule's own reward.

Settling (``apply_judgement``): ``JudgeRecord.reward`` None (the judge failed after its
retries, or its answer could not be parsed) ends the episode as ``reward_error`` (flagged,
never scored 0); otherwise the episode's reward becomes ``JudgeRecord.reward``: the last
turn's reward is set so the turns sum to it, and the turns before it keep their own rewards
(a missing one counts 0). Its ``Episode.success`` becomes ``reward >= success_threshold``
(``reward.success_threshold``, read from the judge's ``success_threshold`` attribute;
``SUCCESS_THRESHOLD`` when it has none), whether the judge scored it or the rule decided
alone (``rule_first``), so one rule says what succeeded in every episode of a judged run. The record is stamped with
the time its episode went to the judge (``submitted_at_s``, given by the session) and the
time it settled (``settled_at_s``), wall-clock epoch seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

from agentrl.errors import RewardError
from agentrl.rollout.state import ActiveEpisode
from agentrl.types import JudgeItem, JudgeRecord, TerminationReason

_TRANSCRIPT_OBS_CHARS = 4000
SUCCESS_THRESHOLD = 0.5
"""The default of ``reward.success_threshold``: a judged reward at or above it is a success."""
Fail = Callable[[ActiveEpisode, TerminationReason, BaseException], object]
"""``RolloutWorker._fail``: ends an episode with a termination reason and the error."""


def judge_item(st: ActiveEpisode) -> JudgeItem:
    """What the judge reads of ``st``'s finished episode (module docstring)."""
    ep = st.episode
    last = ep.turns[-1] if ep.turns else None
    answer = st.final_answer if st.final_answer is not None else (last.action_text if last is not None else "")
    parts = []
    for k, t in enumerate(ep.turns):
        parts.append(f"[turn {k} action]\n{t.action_text}")
        if t.observation_text:
            obs = t.observation_text
            if len(obs) > _TRANSCRIPT_OBS_CHARS:
                obs = obs[:_TRANSCRIPT_OBS_CHARS] + f"\n[... {len(obs) - _TRANSCRIPT_OBS_CHARS} characters cut]"
            parts.append(f"[turn {k} observation]\n{obs}")
    outputs = tuple((r.stdout or "") + (r.stderr or "") for t in ep.turns for r in t.exec_results)
    return JudgeItem(task=st.task_text, reference=st.reference_answer, answer=answer,
                     transcript="\n\n".join(parts), tool_outputs=outputs, rule_reward=ep.total_reward)


def success_threshold_of(judge: object) -> float:
    """The reward at or above which a judged episode succeeded: ``judge.success_threshold``
    (``reward.success_threshold``), ``SUCCESS_THRESHOLD`` when the judge has none."""
    return float(getattr(judge, "success_threshold", SUCCESS_THRESHOLD))


def apply_judgement(st: ActiveEpisode, fut: Future, fail: Fail, submitted_at_s: float | None = None,
                    success_threshold: float = SUCCESS_THRESHOLD) -> None:
    """Settle ``st``'s episode with its judgement (module docstring). A judge object that
    raised instead of returning a record is the judge's failure: ``reward_error``.
    ``submitted_at_s``: when the episode went to the judge (epoch seconds)."""
    try:
        rec = fut.result()
    except Exception as exc:  # the scorer's own failure: never the model's
        rec = exc
    _settle(st, rec, fail, (submitted_at_s, time.time()), success_threshold)


def apply_group_judgement(sts: list[ActiveEpisode], fut: Future, fail: Fail, submitted_at_s: float | None = None,
                          success_threshold: float = SUCCESS_THRESHOLD) -> None:
    """Settle the episodes of one group judged in one call (a group-mode judge's
    ``submit_group``: one ``JudgeRecord`` per episode, in order); ``submitted_at_s``: when
    the group went to the judge (epoch seconds)."""
    try:
        recs = fut.result()
    except Exception as exc:  # the scorer's own failure: never the model's
        recs = [exc] * len(sts)
    if not isinstance(recs, list) or len(recs) != len(sts):
        what = f"{len(recs)} records" if isinstance(recs, list) else type(recs).__name__
        recs = [TypeError(f"the group judge returned {what} for {len(sts)} episodes")] * len(sts)
    stamps = (submitted_at_s, time.time())
    for st, rec in zip(sts, recs):
        _settle(st, rec, fail, stamps, success_threshold)


def _settle(st: ActiveEpisode, rec: object, fail: Fail, stamps: tuple[float | None, float | None] = (None, None),
            success_threshold: float = SUCCESS_THRESHOLD) -> None:
    ep = st.episode
    why = None
    if isinstance(rec, BaseException):
        why = f"failed: {type(rec).__name__}: {rec}"
    elif not isinstance(rec, JudgeRecord):
        why = f"returned {type(rec).__name__}; expected a JudgeRecord"
    else:
        ep.judgement = rec
        if stamps[0] is not None:
            rec.submitted_at_s, rec.settled_at_s = stamps
        if rec.reward is None:
            why = f"gave no reward: {rec.error or 'no reason'}"
    if why is not None:
        fail(st, TerminationReason.REWARD_ERROR, RewardError(f"the judge of episode {ep.episode_id} {why}"))
        return
    if ep.turns:
        for t in ep.turns[:-1]:
            if t.reward is None:
                t.reward = 0.0
        ep.turns[-1].reward = float(rec.reward) - sum(float(t.reward) for t in ep.turns[:-1])
    ep.success = float(rec.reward) >= success_threshold  # judged or rule-decided: one rule for the run


def judge_metrics(episodes: list) -> dict[str, float]:
    """The ``judge/*`` metrics of a batch (docs/metrics.md): episodes with a judgement
    (``judge/episodes``), those a judge scored (``judge/judged``) or the rule decided alone
    (``judge/rule_decided``), judge calls (``judge/calls``), answers from the cache
    (``judge/cache_hits``), unparseable answers (``judge/parse_errors``), judgements with no
    reward (``judge/errors``: reward errors), the latency of the calls made
    (``judge/latency_p50_s``, ``judge/latency_p99_s``), each episode's wait from its submit to
    its settle (``judge/wait_p50_s``, ``judge/wait_p99_s``: queue, calls and retries; records
    with both stamps, NaN when none has them) and the mean judge score
    (``judge/score_mean``). ``{}`` when no episode has a judgement."""
    recs = [e.judgement for e in episodes if getattr(e, "judgement", None) is not None]
    if not recs:
        return {}
    lat = sorted(r.latency_s for r in recs if r.judged and not r.cached and r.calls > 0)
    wait = sorted(r.settled_at_s - r.submitted_at_s for r in recs
                  if r.submitted_at_s is not None and r.settled_at_s is not None)
    scores = [r.score for r in recs if r.score is not None]

    def q(xs: list[float], p: float) -> float:
        return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))] if xs else float("nan")

    return {
        "judge/episodes": float(len(recs)),
        "judge/judged": float(sum(r.judged for r in recs)),
        "judge/rule_decided": float(sum(not r.judged for r in recs)),
        "judge/calls": float(sum(r.calls for r in recs)),
        "judge/cache_hits": float(sum(r.cached for r in recs)),
        "judge/parse_errors": float(sum(r.parse_errors for r in recs)),
        "judge/errors": float(sum(r.reward is None for r in recs)),
        "judge/latency_p50_s": q(lat, 0.5),
        "judge/latency_p99_s": q(lat, 0.99),
        "judge/wait_p50_s": q(wait, 0.5),
        "judge/wait_p99_s": q(wait, 0.99),
        "judge/score_mean": float(sum(scores) / len(scores)) if scores else float("nan"),
    }
