"""The run page's charts from the ``metrics`` table: reward and success rate against the
iteration, the cumulative generated tokens and the wall-clock; token accounting; the time of
each phase per iteration (stacked); the engine↔trainer log-prob gap; staleness (async runs).

Metric names are the ones the training loop writes (``rollout/reward_mean``,
``tokens/generated``, ``time/rollout_s``, ``timeline/checkpoint_start_s``,
``rollout_corr/gap_abs_mean``, ``async/staleness_mean`` ...; ``agentrl.cluster.iteration``).
Iterations are 0-based, as stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from agentrl.replay.viewer.charts import Chart, line_chart, stacked_bars

Series = dict[str, list[tuple[int, float]]]
PHASES = ("rollout", "credit", "update", "sync", "replay", "checkpoint")
"""Phases of one iteration, in the order they run."""
TOKEN_KEYS = ("tokens/generated", "tokens/trained", "tokens/discarded")
METRIC_PREFIXES = ("rollout/reward_mean", "rollout/success_rate", "rollout/generated_tokens", "tokens/", "time/",
                   "timeline/", "rollout_corr/gap_abs_", "async/staleness_", "eval/pass@1")
"""The metrics the charts read (``queries.run_metrics(..., prefixes=METRIC_PREFIXES)``)."""
EVAL_KEYS = (("eval pass@1", "eval/pass@1"), ("eval pass@1 95% low", "eval/pass@1_low"),
             ("eval pass@1 95% high", "eval/pass@1_high"))
"""The held-out evaluation drawn beside the train reward (``agentrl.cluster.evaluate``: the
eval after an iteration is stored at that iteration, its episodes ``kind='eval'``)."""


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
    ``i`` here."""
    out: dict[str, list[float]] = {}
    for ph in PHASES:
        direct = _by_it(metrics, f"time/{ph}_s")
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
    return out


def run_charts(metrics: Series, link: Callable[[int], str], is_async: bool,
               eval_link: Callable[[int], str] | None = None) -> list[Chart]:
    """Every chart of the run page; ``link(iteration)`` is the URL of that iteration's (train)
    episodes, ``eval_link(iteration)`` that of its eval episodes (the eval pass@1 points;
    ``link`` when not given)."""
    its = sorted({it for s in metrics.values() for it, _ in s})
    reward, success = _by_it(metrics, "rollout/reward_mean"), _by_it(metrics, "rollout/success_rate")
    gen = _by_it(metrics, "tokens/generated") or _by_it(metrics, "rollout/generated_tokens")
    wall = _by_it(metrics, "time/iteration_s")
    if not wall:
        phases = phase_seconds(metrics, its)
        wall = {it: sum(v[i] for v in phases.values() if math.isfinite(v[i])) for i, it in enumerate(its)}
    cum_tokens, cum_wall = _cumulative(its, gen), _cumulative(its, wall)

    def quality(x_of: dict[int, float] | None) -> list[tuple[str, list[tuple[float, float, str]]]]:
        def pts(values: dict[int, float], to: Callable[[int], str] = link):
            return [(float(it) if x_of is None else x_of[it], v, to(it)) for it, v in sorted(values.items())
                    if x_of is None or it in x_of]
        out = [("reward", pts(reward)), ("success rate", pts(success))]
        return out + [(name, pts(_by_it(metrics, key), eval_link or link)) for name, key in EVAL_KEYS
                      if key in metrics]

    charts = [
        line_chart("reward-iteration", "Reward and success rate / iteration", "iteration", "", quality(None)),
        line_chart("reward-tokens", "Reward and success rate / cumulative generated tokens", "tokens", "",
                   quality(cum_tokens)),
        line_chart("reward-wallclock", "Reward and success rate / wall-clock", "seconds", "", quality(cum_wall),
                   x_unit=" s"),
    ]
    tok = [(k.split("/")[1], [_by_it(metrics, k).get(it, math.nan) for it in its]) for k in TOKEN_KEYS]
    charts.append(line_chart("tokens", "Token accounting / iteration", "iteration", "tokens",
                             [(name, [(float(it), v[i], link(it)) for i, it in enumerate(its)]) for name, v in tok]))
    phases = phase_seconds(metrics, its)
    charts.append(stacked_bars("phases", "Time of each phase / iteration (stacked)", "s", its,
                               list(phases.items()), [link(it) for it in its]))
    gap_keys = [("mean |gap|", "rollout_corr/gap_abs_mean"), ("p99 |gap|", "rollout_corr/gap_abs_p99"),
                ("max |gap|", "rollout_corr/gap_abs_max")]
    charts.append(line_chart("logprob-gap", "Engine ↔ trainer log-prob gap (nats) / iteration", "iteration",
                             "nats", [(n, [(float(it), v, link(it)) for it, v in metrics.get(k, ())])
                                      for n, k in gap_keys]))
    stale = [("mean", "async/staleness_mean"), ("max", "async/staleness_max")]
    if is_async or any(k in metrics for _, k in stale):
        charts.append(line_chart("staleness", "Staleness (policy versions) / update", "iteration", "versions",
                                 [(n, [(float(it), v, link(it)) for it, v in metrics.get(k, ())]) for n, k in stale]))
    return charts


def token_table(metrics: Series) -> list[tuple[int, list[float]]]:
    """``[(iteration, [generated, trained, discarded])]`` (NaN where not written)."""
    its = sorted({it for k in TOKEN_KEYS for it, _ in metrics.get(k, ())})
    cols = [_by_it(metrics, k) for k in TOKEN_KEYS]
    return [(it, [c.get(it, math.nan) for c in cols]) for it in its]
