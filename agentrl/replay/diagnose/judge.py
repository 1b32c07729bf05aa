"""``agentrl diagnose``'s checks of a run's judge, from the stored judgements of its training
episodes (``EpisodeFacts.judge``, table ``judgements``; ``training_episodes``'s choice). Each
returns a ``Finding`` like the checks of the symptom table (``JUDGE_CHECKS``); a run without
judgements (no judge, or a database of schema 9 or older) has no judge findings.

A judge "passes" an answer at a score >= ``JUDGE_PASS`` and the rule at a rule reward >=
``RULE_PASS``. The answer's length is the characters of the episode's last action, stripped
(``EpisodeFacts.last_action_chars``): the judge's answer is that text unless the env parsed a
final answer out of it, which is stored only inside the judge's prompt.

- ``judge_rule_agreement``: share of judged episodes with a rule reward where judge and rule
  agree; fires when the judge rejects more than ``MAX_RULE_REJECT`` of the answers the rule
  proves correct (with ``combine: rule_first`` the judge never sees those).
- ``judge_length_bias``: Spearman correlation of score with answer length.
- ``judge_position_bias``: mean score by position in a group call (``mode: group``).
- ``judge_constant``: the same score for (nearly) every episode.
- ``judge_drift``: mean score on rule-positive episodes, first third of the run against the
  last; the error and parse-error rates by iteration.
- ``judge_cost``: judged episodes, calls, cache hits, errors, latency (never fires).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence

from agentrl.replay.diagnose.checks import MAX_EXAMPLES, Finding, _skipped, spearman, training_episodes
from agentrl.replay.diagnose.data import EpisodeFacts, JudgeFacts, RunData
from agentrl.replay.read.judge import JUDGE_PASS, RULE_PASS  # the pass marks the viewer's chart uses too

SYMPTOM = "judge"
"""The symptom column of every judge finding."""
MAX_RULE_REJECT = 0.1
"""Fires above this share of rule-positive episodes that the judge rejects: a rule that says
correct is proof (MathAnswer's rule never accepts a wrong answer), so a judge that rejects
more than one in ten of them misreads answers or the reference."""
LENGTH_RHO = 0.3
"""|Spearman rho| of score with answer length above which the judge pays (or punishes) length:
correctness of short final answers hardly depends on their length."""
MIN_EPISODES = 20
"""Fewest judge scores before a length correlation or a constant judge is called."""
POSITION_SPREAD = 0.2
"""Spread (max - min) of the mean score by position in a group call above which the judge
favours a position: the positions are the group's answers in arbitrary order."""
MIN_POSITION_EPISODES = 5
"""Fewest scores at a position before its mean is compared."""
CONSTANT_STD = 0.01
"""Population standard deviation of the scores below which the judge is constant."""
DRIFT = 0.2
"""Move of the mean score on rule-positive episodes (first third of the run's iterations to the
last) above which the judge drifts: the answers it should pass are equally correct throughout."""
MIN_DRIFT_ITERATIONS = 3
"""Fewest iterations with judged rule-positive episodes before thirds are compared."""


def _judged(data: RunData) -> list[tuple[EpisodeFacts, JudgeFacts]]:
    """Training episodes with a judgement, paired with it."""
    return [(e, e.judge) for e in training_episodes(data) if e.judge is not None]


def _scored(data: RunData) -> list[tuple[EpisodeFacts, JudgeFacts, float]]:
    """Judged training episodes with a judge score (the judge was asked and answered)."""
    return [(e, j, j.score) for e, j in _judged(data) if j.judged and j.score is not None]


def _ids(rows: Sequence[tuple[EpisodeFacts, ...]]) -> list[str]:
    return [r[0].episode_id for r in rows[:MAX_EXAMPLES]]


def check_judge_rule_agreement(data: RunData) -> Finding:
    both = [(e, j, s) for e, j, s in _scored(data) if j.rule_reward is not None]
    th = {"judge_pass": JUDGE_PASS, "rule_pass": RULE_PASS, "max_rule_reject": MAX_RULE_REJECT}
    if not both:
        return _skipped("judge_rule_agreement", SYMPTOM, "no judge score with a rule reward beside it",
                        {"episodes": 0}, th)
    agree = sum((s >= JUDGE_PASS) == (j.rule_reward >= RULE_PASS) for _, j, s in both)  # type: ignore[operator]
    pos = [r for r in both if r[1].rule_reward >= RULE_PASS]  # type: ignore[operator]
    rejected = [r for r in pos if r[2] < JUDGE_PASS]
    neg = len(both) - len(pos)
    accepted = sum(s >= JUDGE_PASS for _, j, s in both if j.rule_reward < RULE_PASS)  # type: ignore[operator]
    reject = len(rejected) / len(pos) if pos else None
    numbers = {"episodes": len(both), "agree": agree, "agreement": round(agree / len(both), 4),
               "rule_positive": len(pos), "rule_positive_rejected": len(rejected),
               "reject_rate": None if reject is None else round(reject, 4),
               "rule_negative": neg, "rule_negative_accepted": accepted}
    summary = f"judge agrees with the rule on {agree}/{len(both)} ({agree / len(both):.0%})"
    if reject is None:
        summary += "; no rule-positive episode was judged (with rule_first the rule decides those)"
    else:
        summary += f"; rejects {len(rejected)}/{len(pos)} rule-positive ({reject:.0%})"
    summary += f"; accepts {accepted}/{neg} rule-negative"
    fired = reject is not None and reject > MAX_RULE_REJECT
    if fired:
        summary += ": the judge rejects answers the rule proves correct"
    return Finding("judge_rule_agreement", SYMPTOM, fired, summary, numbers, th, _ids(rejected) if fired else [])


def check_judge_length_bias(data: RunData) -> Finding:
    rows = _scored(data)
    th = {"length_rho": LENGTH_RHO, "min_episodes": MIN_EPISODES}
    if len(rows) < MIN_EPISODES:
        return _skipped("judge_length_bias", SYMPTOM, f"needs {MIN_EPISODES}+ judge scores ({len(rows)} here)",
                        {"episodes": len(rows)}, th)
    rho = spearman([float(e.last_action_chars) for e, _, _ in rows], [s for _, _, s in rows])
    passed = [e.last_action_chars for e, _, s in rows if s >= JUDGE_PASS]
    failed = [e.last_action_chars for e, _, s in rows if s < JUDGE_PASS]
    numbers = {"episodes": len(rows), "spearman": None if rho is None else round(rho, 4),
               "mean_chars_passed": round(statistics.fmean(passed), 2) if passed else None,
               "mean_chars_rejected": round(statistics.fmean(failed), 2) if failed else None}
    if rho is None:
        return Finding("judge_length_bias", SYMPTOM, False,
                       "score or answer length is constant: no correlation to measure", numbers, th)
    fired = abs(rho) > LENGTH_RHO
    summary = f"score~answer length spearman {rho:.2f} over {len(rows)} episodes"
    if fired:
        summary += f": the judge {'pays' if rho > 0 else 'punishes'} length"
    top = sorted(rows, key=lambda r: (-r[2], -r[0].last_action_chars if rho > 0 else r[0].last_action_chars))
    return Finding("judge_length_bias", SYMPTOM, fired, summary, numbers, th, _ids(top) if fired else [])


def check_judge_position_bias(data: RunData) -> Finding:
    by: dict[int, list[float]] = defaultdict(list)
    for _, j, s in _scored(data):
        if j.group_position is not None:
            by[j.group_position].append(s)
    th = {"position_spread": POSITION_SPREAD, "min_position_episodes": MIN_POSITION_EPISODES}
    numbers: dict = {"positions": {str(p): {"episodes": len(v), "score_mean": round(statistics.fmean(v), 4)}
                                   for p, v in sorted(by.items())}}
    if not by:
        return _skipped("judge_position_bias", SYMPTOM, "no group judgements (each episode was judged alone)",
                        numbers, th)
    means = {p: statistics.fmean(v) for p, v in by.items() if len(v) >= MIN_POSITION_EPISODES}
    if len(means) < 2:
        return _skipped("judge_position_bias", SYMPTOM,
                        f"needs 2+ group positions with {MIN_POSITION_EPISODES}+ scores each", numbers, th)
    hi, lo = max(means, key=means.__getitem__), min(means, key=means.__getitem__)
    spread = means[hi] - means[lo]
    numbers["spread"] = round(spread, 4)
    fired = spread > POSITION_SPREAD
    return Finding("judge_position_bias", SYMPTOM, fired,
                   f"mean score {means[hi]:.2f} at position {hi}, {means[lo]:.2f} at position {lo} "
                   f"(spread {spread:.2f})"
                   + (": the judge favours a position" if fired else ""), numbers, th)


def check_judge_constant(data: RunData) -> Finding:
    rows = _scored(data)
    th = {"constant_std": CONSTANT_STD, "min_episodes": MIN_EPISODES}
    if len(rows) < MIN_EPISODES:
        return _skipped("judge_constant", SYMPTOM, f"needs {MIN_EPISODES}+ judge scores ({len(rows)} here)",
                        {"episodes": len(rows)}, th)
    scores = [s for _, _, s in rows]
    std = statistics.pstdev(scores)
    mean = statistics.fmean(scores)
    numbers = {"episodes": len(rows), "score_mean": round(mean, 4), "score_std": round(std, 4),
               "distinct_scores": len(set(scores))}
    fired = std < CONSTANT_STD
    summary = (f"{len(rows)} judge scores all near {mean:.2f} (std {std:.4f}): the judge is not reading the answers"
               if fired else f"judge scores vary (mean {mean:.2f}, std {std:.3f}, {len(set(scores))} distinct)")
    return Finding("judge_constant", SYMPTOM, fired, summary, numbers, th, _ids(rows) if fired else [])


def _rate(rows: Sequence[tuple[EpisodeFacts, JudgeFacts]], num: Callable[[JudgeFacts], int],
          den: Callable[[JudgeFacts], int]) -> float | None:
    d = sum(den(j) for _, j in rows)
    return round(sum(num(j) for _, j in rows) / d, 4) if d else None


def check_judge_drift(data: RunData) -> Finding:
    judged = [(e, j) for e, j in _judged(data) if j.judged]
    by_it: dict[int, list[tuple[EpisodeFacts, JudgeFacts]]] = defaultdict(list)
    for e, j in judged:
        by_it[e.iteration].append((e, j))
    pos: dict[int, list[float]] = defaultdict(list)
    for e, j, s in _scored(data):
        if j.rule_reward is not None and j.rule_reward >= RULE_PASS:
            pos[e.iteration].append(s)
    numbers: dict = {
        "rule_positive_score_by_iteration": {str(it): round(statistics.fmean(v), 4) for it, v in sorted(pos.items())},
        "error_rate_by_iteration": {str(it): _rate(r, lambda j: j.error is not None, lambda j: 1)
                                    for it, r in sorted(by_it.items())},
        "parse_error_rate_by_iteration": {str(it): _rate(r, lambda j: j.parse_errors, lambda j: j.calls)
                                          for it, r in sorted(by_it.items())}}
    th = {"drift": DRIFT, "min_drift_iterations": MIN_DRIFT_ITERATIONS, "rule_pass": RULE_PASS}
    errors = sum(j.error is not None for _, j in judged)
    tail = f"; errors {errors}/{len(judged)} judged episodes" if judged else ""
    its = sorted(pos)
    if len(its) < MIN_DRIFT_ITERATIONS:
        return _skipped("judge_drift", SYMPTOM,
                        f"needs judged rule-positive episodes in {MIN_DRIFT_ITERATIONS}+ iterations ({len(its)} here; "
                        f"with rule_first the rule decides those){tail}", numbers, th)
    k = len(its) // 3
    first = statistics.fmean(s for it in its[:k] for s in pos[it])
    last = statistics.fmean(s for it in its[-k:] for s in pos[it])
    numbers.update(first_third=round(first, 4), last_third=round(last, 4), move=round(last - first, 4),
                   first_iterations=its[:k], last_iterations=its[-k:])
    fired = abs(last - first) > DRIFT
    examples = [e.episode_id for e, j, s in _scored(data) if e.iteration in its[-k:] and j.rule_reward is not None
                and j.rule_reward >= RULE_PASS and s < JUDGE_PASS][:MAX_EXAMPLES] if fired else []
    return Finding("judge_drift", SYMPTOM, fired,
                   f"mean score on rule-positive episodes {first:.2f} (iterations {its[0]}-{its[k - 1]}) -> "
                   f"{last:.2f} (iterations {its[-k]}-{its[-1]}){': the judge drifts' if fired else ''}{tail}",
                   numbers, th, examples)


def _quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile by the ``judge/latency_p*_s`` metrics' rule (nearest rank)."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))]


def check_judge_cost(data: RunData) -> Finding:
    rows = _judged(data)
    lat = sorted(j.latency_s for _, j in rows if j.judged and not j.cached and j.calls > 0)
    p50, p99 = _quantile(lat, 0.5), _quantile(lat, 0.99)
    numbers = {"episodes": len(rows), "judged": sum(j.judged for _, j in rows),
               "rule_decided": sum(not j.judged for _, j in rows), "calls": sum(j.calls for _, j in rows),
               "cache_hits": sum(j.cached for _, j in rows), "errors": sum(j.error is not None for _, j in rows),
               "parse_errors": sum(j.parse_errors for _, j in rows), "latency_p50_s": p50, "latency_p99_s": p99,
               "models": sorted({j.model for _, j in rows})}
    lat_txt = f", latency p50 {p50:.2f} s, p99 {p99:.2f} s" if p50 is not None and p99 is not None else ""
    return Finding("judge_cost", SYMPTOM, False,
                   f"{numbers['judged']} judged ({numbers['rule_decided']} decided by the rule), {numbers['calls']} "
                   f"calls, {numbers['cache_hits']} cache hits, {numbers['errors']} errors, "
                   f"{numbers['parse_errors']} parse errors{lat_txt}", numbers, {})


JUDGE_CHECKS: tuple[Callable[[RunData], Finding], ...] = (
    check_judge_rule_agreement, check_judge_length_bias, check_judge_position_bias, check_judge_constant,
    check_judge_drift, check_judge_cost)
"""Every judge check, in report order."""


def judge_findings(data: RunData) -> tuple[int, list[Finding]]:
    """``(judged training episodes, findings)``: every ``JUDGE_CHECKS`` finding, or ``(0, [])``
    when the run has no judgements (no judge, or no ``judgements`` table: schema 9 or older)."""
    n = len(_judged(data))
    return (n, [check(data) for check in JUDGE_CHECKS]) if n else (0, [])


__all__ = ["JUDGE_CHECKS", "judge_findings"] + [c.__name__ for c in JUDGE_CHECKS]
