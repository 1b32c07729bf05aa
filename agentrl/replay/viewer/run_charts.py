"""The run page's charts from the ``metrics`` table: reward and success rate against the
iteration, the cumulative generated tokens and the wall-clock; token accounting; the time of
each phase per iteration (stacked); the engine↔trainer log-prob gap; staleness (async runs).

Metric names are the ones the training loop writes (``rollout/reward_mean``,
``tokens/generated``, ``time/rollout_s``, ``timeline/checkpoint_start_s``,
``rollout_corr/gap_abs_mean``, ``async/staleness_mean`` ...; ``agentrl.driver.iteration``).
Iterations are numbered as stored. A run whose episodes were judged adds the judge score against
the rule reward from the ``judgements`` table (``read.judge_iterations``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from agentrl.replay.read import JudgeIteration
from agentrl.replay.viewer.charts import Chart, fmt, line_chart, stacked_bars

Series = dict[str, list[tuple[int, float]]]
PHASES = ("rollout", "judge", "credit", "update", "sync", "replay", "checkpoint")
"""Phases of one iteration, in the order they run. ``judge`` is the judge's tail
(``time/judge_tail_s``: the rollout waiting for judgements alone after its last episode
ended), carved out of ``rollout`` so no second counts twice (``phase_seconds``)."""
_PHASE_KEY = {"judge": "time/judge_tail_s"}
"""The metric of a phase's seconds where it is not ``time/<phase>_s``."""
TOKEN_KEYS = ("tokens/generated", "tokens/trained", "tokens/discarded")
EVAL_KEYS = (("eval pass@1", "eval/pass@1"), ("eval pass@1 95% low", "eval/pass@1_low"),
             ("eval pass@1 95% high", "eval/pass@1_high"))
"""The held-out evaluation drawn beside the train reward (``agentrl.commands.evaluate``: the
eval after an iteration is stored at that iteration, its episodes ``kind='eval'``)."""
GAP_KEYS = (("mean |gap|", "rollout_corr/gap_abs_mean"), ("p99 |gap|", "rollout_corr/gap_abs_p99"),
            ("max |gap|", "rollout_corr/gap_abs_max"))
STALENESS_KEYS = (("mean", "async/staleness_mean"), ("max", "async/staleness_max"))
SPLIT_KEYS = ("time/profile_s", "time/eval_before_s")
"""Metrics of a run that stores other episodes beside its training rows (a difficulty
profile, an eval before training): the run page then links to training episodes only."""
METRIC_KEYS = tuple(dict.fromkeys((
    "rollout/reward_mean", "rollout/success_rate", "rollout/generated_tokens", *TOKEN_KEYS, "time/iteration_s",
    *(_PHASE_KEY.get(ph, f"time/{ph}_s") for ph in PHASES),
    *(f"timeline/{ph}_{end}_s" for ph in PHASES if ph not in _PHASE_KEY for end in ("start", "end")),
    *(k for _, k in EVAL_KEYS + GAP_KEYS + STALENESS_KEYS), *SPLIT_KEYS)))
"""Every metric the run page reads (``read.metric_series(..., keys=METRIC_KEYS)``): about 35
of the 100 or so keys a training iteration writes."""


def _by_it(metrics: Series, key: str) -> dict[int, float]:
    return dict(metrics.get(key, ()))


def _cumulative(its: list[int], per_it: dict[int, float]) -> dict[int, float]:
    acc, out = 0.0, {}
    for it in its:
        v = per_it.get(it, math.nan)
        if math.isfinite(v):
            acc += v
        out[it] = acc
    return out


def phase_seconds(metrics: Series, its: list[int]) -> dict[str, list[float]]:
    """Seconds per phase and iteration: ``time/<phase>_s`` where written, else
    ``timeline/<phase>_end_s - _start_s``. The checkpoint after iteration ``i`` is written
    after its metrics, so its timeline sits in iteration ``i + 1``'s line; it is moved back to
    ``i`` here. ``judge`` is ``time/judge_tail_s`` (at most the rollout's seconds), taken off
    ``rollout``: the stack sums to the iteration's time."""
    out: dict[str, list[float]] = {}
    for ph in PHASES:
        direct = _by_it(metrics, _PHASE_KEY.get(ph, f"time/{ph}_s"))
        if ph in _PHASE_KEY:  # its timeline spans another phase: no fallback to it
            start, end = {}, {}
        else:
            start, end = _by_it(metrics, f"timeline/{ph}_start_s"), _by_it(metrics, f"timeline/{ph}_end_s")
        shift = 1 if ph == "checkpoint" else 0
        vals = []
        for it in its:
            if it in direct:
                vals.append(direct[it])
            elif it + shift in start and it + shift in end:
                vals.append(end[it + shift] - start[it + shift])
            else:
                vals.append(math.nan)
        if any(math.isfinite(v) for v in vals):
            out[ph] = vals
    if "judge" in out and "rollout" in out:
        for i, (roll, tail) in enumerate(zip(out["rollout"], out["judge"])):
            if math.isfinite(roll) and math.isfinite(tail):
                tail = min(max(tail, 0.0), roll)
                out["rollout"][i], out["judge"][i] = roll - tail, tail
    return out


def run_charts(metrics: Series, link: Callable[[int], str], is_async: bool,
               eval_link: Callable[[int], str] | None = None) -> list[Chart]:
    """Every chart of the run page from ``metrics`` (each series ascending by iteration, as
    ``read.metric_series`` returns it); ``link(iteration)`` is the URL of that iteration's (train)
    episodes, ``eval_link(iteration)`` that of its eval episodes (the eval pass@1 points;
    ``link`` when not given). Each link is made once per iteration (a run of 1,000
    iterations draws about 120 points per series but has a link for every iteration)."""
    link = functools.cache(link)
    eval_link = functools.cache(eval_link) if eval_link is not None else None
    its = sorted({it for s in metrics.values() for it, _ in s})
    gen = _by_it(metrics, "tokens/generated") or _by_it(metrics, "rollout/generated_tokens")
    wall = _by_it(metrics, "time/iteration_s")
    if not wall:
        phases = phase_seconds(metrics, its)
        wall = {it: sum(v[i] for v in phases.values() if math.isfinite(v[i])) for i, it in enumerate(its)}
    cum_tokens, cum_wall = _cumulative(its, gen), _cumulative(its, wall)

    def quality(x_of: dict[int, float] | None) -> list[tuple[str, list[tuple[float, float, str]]]]:
        def pts(key: str, to: Callable[[int], str] = link):  # a series is in iteration order
            if x_of is None:
                return [(float(it), v, to(it)) for it, v in metrics.get(key, ())]
            return [(x_of[it], v, to(it)) for it, v in metrics.get(key, ()) if it in x_of]
        out = [("reward", pts("rollout/reward_mean")), ("success rate", pts("rollout/success_rate"))]
        return out + [(name, pts(key, eval_link or link)) for name, key in EVAL_KEYS if key in metrics]

    charts = [
        line_chart("reward-iteration", "Reward and success rate / iteration", "iteration", "", quality(None)),
        line_chart("reward-tokens", "Reward and success rate / cumulative generated tokens", "tokens", "",
                   quality(cum_tokens)),
        line_chart("reward-wallclock", "Reward and success rate / wall-clock", "seconds", "", quality(cum_wall),
                   x_unit=" s"),
    ]
    tok = [(k.split("/")[1], [by_it.get(it, math.nan) for it in its])
           for k, by_it in ((k, _by_it(metrics, k)) for k in TOKEN_KEYS)]
    charts.append(line_chart("tokens", "Token accounting / iteration", "iteration", "tokens",
                             [(name, [(float(it), v[i], link(it)) for i, it in enumerate(its)]) for name, v in tok]))
    phases = phase_seconds(metrics, its)
    charts.append(stacked_bars("phases", "Time of each phase / iteration (stacked)", "s", its,
                               list(phases.items()), [link(it) for it in its]))
    charts.append(line_chart("logprob-gap", "Engine ↔ trainer log-prob gap (nats) / iteration", "iteration",
                             "nats", [(n, [(float(it), v, link(it)) for it, v in metrics.get(k, ())])
                                      for n, k in GAP_KEYS]))
    if is_async or any(k in metrics for _, k in STALENESS_KEYS):
        charts.append(line_chart("staleness", "Staleness (policy versions) / update", "iteration", "versions",
                                 [(n, [(float(it), v, link(it)) for it, v in metrics.get(k, ())])
                                  for n, k in STALENESS_KEYS]))
    return charts


def token_table(metrics: Series) -> list[tuple[int, list[float]]]:
    """``[(iteration, [generated, trained, discarded])]`` (NaN where not written)."""
    its = sorted({it for k in TOKEN_KEYS for it, _ in metrics.get(k, ())})
    cols = [_by_it(metrics, k) for k in TOKEN_KEYS]
    return [(it, [c.get(it, math.nan) for c in cols]) for it in its]


def judge_chart(rows: Sequence[JudgeIteration], link: Callable[[int], str]) -> Chart:
    """The judge score against the rule reward per iteration (``read.judge_iterations``): the
    mean judge score and the mean rule reward of the episodes the judge scored, and the share
    of those where judge and rule disagree; each point links to ``link(iteration)`` and its
    label says how many episodes it counts."""
    series = [("judge score (mean)", [(r, r.score_mean) for r in rows], "scored"),
              ("rule reward (mean)", [(r, r.rule_reward_mean) for r in rows], "scored"),
              ("judge ≠ rule (share)", [(r, r.disagree_share) for r in rows], "compared")]
    chart = line_chart("judge-rule", "Judge score vs rule reward / iteration", "iteration", "",
                       [(name, [(float(r.iteration), v, link(r.iteration)) for r, v in pts if v is not None])
                        for name, pts, _ in series])
    by_it = {r.iteration: r for r in rows}
    for line, (_, _, base) in zip(chart.lines, series):
        for p in line.points:
            r = by_it[int(p.x)]
            detail = f"{r.disagree} of {r.compared}" if base == "compared" else f"of {r.scored} scored"
            p.label = f"{line.name}: {fmt(p.y)} at iteration {int(p.x)} ({detail} episodes)"
    return chart
