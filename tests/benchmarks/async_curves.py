"""Learning curves of ``tests/benchmarks/bench_async.py`` across seeds: reward against
rollout tokens for each run, each mode's reward at a common token budget with its spread over
seeds, the "not worse beyond noise" verdict, and an SVG of the curves. Pure (no Ray, no
model); unit tests in ``tests/unit/benchmarks/test_bench_async_report.py``.

Reads ``async_report.learning_curve`` points: ``{"iteration", "rollout_tokens" (cumulative),
"reward_mean", "success_rate"}`` per iteration, and ``policy_curve`` points (the same keys but
``success_rate``, one per policy version): the policy's own curve, which does not run behind by
the samples' lag as the training curve does in async mode. Also the throughput ratios'
geometric mean and the verdict line every comparison prints.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, Sequence
from xml.sax.saxutils import escape

from async_report import svg_head  # same directory (bench_async.py puts it on sys.path)

__all__ = ["MODE_COLORS", "reward_at_budget", "compare_values", "compare_seeds", "compare_at_budget", "policy_curve", "geometric_mean",
           "verdict_line", "curves_svg"]

MODE_COLORS = {"sync": "#4e79a7", "async": "#e15759"}


def reward_at_budget(curve: Sequence[Mapping[str, float]], budget_tokens: float, window: float = 0.5) -> float:
    """Mean ``reward_mean`` of the iterations that end within the last ``window`` fraction of
    the first ``budget_tokens`` rollout tokens (cumulative tokens in ``((1 - window) * budget,
    budget]``): where a run stands after that many tokens, averaged over a few iterations
    against the per-iteration noise. NaN when no iteration falls there.

    Raises:
        ValueError: ``window`` not in (0, 1] or ``budget_tokens`` <= 0.
    """
    if not 0.0 < window <= 1.0 or not budget_tokens > 0:
        raise ValueError(f"window={window} must be in (0, 1] and budget_tokens={budget_tokens} > 0")
    lo = (1.0 - window) * budget_tokens
    vals = [p["reward_mean"] for p in curve
            if lo < p["rollout_tokens"] <= budget_tokens and not math.isnan(p["reward_mean"])]
    return sum(vals) / len(vals) if vals else math.nan


def compare_values(values: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Per mode, one value per run (seed): mean, sample standard deviation, range; with both
    ``sync`` and ``async`` present, ``difference`` (async mean - sync mean), ``se_difference``
    (Welch: sqrt(sd_s^2 / n_s + sd_a^2 / n_a)), ``noise`` (the larger of the two sds: one sigma
    of seed-to-seed spread) and ``within_noise`` (async mean >= sync mean - noise). NaN values
    (a run with nothing to measure) are left out of the statistics.

    Raises:
        ValueError: no modes, or a mode without values.
    """
    if not values or any(len(v) == 0 for v in values.values()):
        raise ValueError(f"expected at least one value per mode, got {({m: len(v) for m, v in values.items()})}")
    out: dict[str, Any] = {"modes": {}}
    for mode, vals in values.items():
        ok = [v for v in vals if not math.isnan(v)]
        out["modes"][mode] = {
            "per_seed": list(vals),
            "mean": sum(ok) / len(ok) if ok else math.nan,
            "std": statistics.stdev(ok) if len(ok) > 1 else 0.0,
            "min": min(ok) if ok else math.nan, "max": max(ok) if ok else math.nan, "n": len(ok),
        }
    if "sync" in out["modes"] and "async" in out["modes"]:
        s, a = out["modes"]["sync"], out["modes"]["async"]
        noise = max(s["std"], a["std"])
        out["noise"] = noise
        out["difference"] = a["mean"] - s["mean"]
        out["se_difference"] = math.sqrt(s["std"] ** 2 / max(1, s["n"]) + a["std"] ** 2 / max(1, a["n"]))
        out["within_noise"] = bool(a["mean"] >= s["mean"] - noise)
    return out


def compare_seeds(curves: Mapping[str, Sequence[Sequence[Mapping[str, float]]]], window: float = 0.5) -> dict[str, Any]:
    """Each mode's reward at the common budget (the fewest rollout tokens any run made), one
    value per run, as ``compare_at_budget`` with every run its own seed.

    Args:
        curves: mode -> one curve per seed (``learning_curve`` output).

    Raises:
        ValueError: a mode without runs, or a run without points.
    """
    if not curves or any(not runs for runs in curves.values()):
        raise ValueError(f"expected at least one run per mode, got {({m: len(r) for m, r in curves.items()})}")
    if any(not c for runs in curves.values() for c in runs):
        raise ValueError("a run has no iterations")
    out = compare_at_budget({m: list(enumerate(runs)) for m, runs in curves.items()}, window, keep_empty=True)
    assert out is not None
    return out


def compare_at_budget(runs: Mapping[str, Sequence[tuple[Any, Sequence[Mapping[str, float]]]]], window: float = 0.5,
                      *, keep_empty: bool = False) -> dict[str, Any] | None:
    """Each mode's reward at the common budget, one value per seed: the budget is the fewest
    tokens any curve reaches; a run's value is ``reward_at_budget``; runs of one seed (repeats)
    are averaged first, so a seed counts once however often it ran. Then ``compare_values``
    over seeds, plus the paired comparison over the seeds both modes ran (a seed fixes the task
    order): ``paired_difference`` (mean of async - sync per seed), ``paired_se`` (its standard
    error; 0 with one seed), ``paired_seeds``. Also ``budget_tokens``, ``window``, ``seeds``
    (per mode, in order) and ``start_per_seed`` (each seed's first point, averaged likewise).

    Args:
        runs: mode -> ``(seed, curve)`` per run; a curve's points as ``learning_curve`` /
            ``policy_curve`` give them.
        keep_empty: compare even when the budget is 0 tokens (every curve's reward at 0 tokens
            is then NaN); otherwise curves ending at 0 tokens are left out, and None is returned
            when a mode has none left.

    Raises:
        ValueError: a mode without runs (with ``keep_empty``), or a bad ``window``.
    """
    use = {m: [(sd, c) for sd, c in rs if c and (keep_empty or c[-1]["rollout_tokens"] > 0)] for m, rs in runs.items()}
    if not use or any(not rs for rs in use.values()):
        if keep_empty:
            raise ValueError(f"expected at least one run per mode, got {({m: len(r) for m, r in runs.items()})}")
        return None
    budget = min(c[-1]["rollout_tokens"] for rs in use.values() for _, c in rs)

    def per_seed(rs: Sequence[tuple[Any, Sequence[Mapping[str, float]]]], value: Any) -> dict[Any, float]:
        acc: dict[Any, list[float]] = {}
        for sd, c in rs:
            acc.setdefault(sd, []).append(value(c))
        return {sd: (sum(v) / len(v) if not any(math.isnan(x) for x in v) else math.nan) for sd, v in acc.items()}

    at = {m: per_seed(rs, lambda c: reward_at_budget(c, budget, window) if budget > 0 else math.nan)
          for m, rs in use.items()}
    out = compare_values({m: list(v.values()) for m, v in at.items()})
    for m, rs in use.items():
        out["modes"][m]["seeds"] = list(at[m])
        out["modes"][m]["start_per_seed"] = list(per_seed(rs, lambda c: c[0]["reward_mean"]).values())
    if "sync" in at and "async" in at:
        both = [sd for sd in at["sync"] if sd in at["async"]
                and not math.isnan(at["sync"][sd]) and not math.isnan(at["async"][sd])]
        diffs = [at["async"][sd] - at["sync"][sd] for sd in both]
        out["paired_seeds"] = both
        out["paired_difference"] = sum(diffs) / len(diffs) if diffs else math.nan
        out["paired_se"] = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return {"budget_tokens": budget, "window": window, **out}


def policy_curve(samples: Iterable[tuple[int, float]], updates: Sequence[tuple[int, float]],
                 complete_through: int) -> list[dict[str, float]]:
    """The learning curve of the policy itself: per policy version ``v``, the mean reward of
    the trained episodes credited to ``v``, at ``x`` = the rollout tokens trained before ``v``
    existed (through the first iteration whose recorded version reaches ``v``; 0 for ``v = 0``).

    ``learning_curve`` puts each update's trained episodes at that update's cumulative tokens;
    in async mode those episodes were sampled by policies up to ``max_staleness`` versions
    older, so that curve runs behind by the samples' lag whether or not the policy learns any
    slower. Here each sample counts for a policy that drew it, at the training tokens that
    policy had seen: sync and async are compared policy against policy. The caller credits an
    episode to the newest version that sampled any of its tokens (``trained_samples``): an
    episode that spans versions (``partial_rollout: continue``) counts for the strongest policy
    in it, which can only favour the mode whose episodes span none (sync). Only versions ``<=
    complete_through`` are kept: a later version's groups may not all have been trained when
    the run ended, and those trained first are the quick ones (in async mode,
    ``complete_through`` = final version - 1 - ``max_staleness``, after which every group
    admitted at a kept version was consumed: ``GroupBuffer.must_include``).

    Args:
        samples: ``(policy version, reward)`` of each trained episode.
        updates: per iteration in order, ``(policy version after it, rollout tokens it
            trained)``; an iteration that trained nothing keeps the version.
        complete_through: the last version kept.

    Returns:
        ``[{"iteration": v, "rollout_tokens": x, "reward_mean": mean, "episodes": n}]`` by
        ``v``, versions without samples left out (``iteration`` names the version, so
        ``compare_seeds`` and ``curves_svg`` read these points as they read a training curve;
        ``x`` counts trained tokens, which in async mode leave out those still in flight).

    Raises:
        ValueError: a version below 0 or above the last iteration's.
    """
    x_of: dict[int, float] = {0: 0.0}
    cum = 0.0
    for version, tokens in updates:
        cum += float(tokens)
        x_of.setdefault(int(version), cum)  # the first iteration that reached it
    last = max(x_of)
    by_version: dict[int, list[float]] = {}
    for version, reward in samples:
        v = int(version)
        if not 0 <= v <= last:
            raise ValueError(f"a sample of policy version {v}; expected 0..{last} (the last iteration's version)")
        by_version.setdefault(v, []).append(float(reward))
    return [{"iteration": float(v), "rollout_tokens": x_of[v], "reward_mean": sum(r) / len(r), "episodes": float(len(r))}
            for v, r in sorted(by_version.items()) if v <= complete_through and v in x_of]


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean(log x)) of positive ``values``: the mean of ratios (the async / sync throughput
    of each pair), for which 2x and 0.5x average to 1x.

    Raises:
        ValueError: no values, or one that is not > 0.
    """
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"expected positive values, got {list(values)}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def verdict_line(label: str, cmp: Mapping[str, Any]) -> str:
    """One comparison's verdict (``compare_values`` / ``compare_seeds`` output) as a line:
    the two means with their sds, the difference with its standard error, the noise line."""
    s, a = cmp["modes"]["sync"], cmp["modes"]["async"]
    return (f"  {label}: sync {s['mean']:.3f} +- {s['std']:.3f}, async {a['mean']:.3f} +- {a['std']:.3f} (sd over "
            f"runs); async - sync = {cmp['difference']:+.3f} (standard error {cmp['se_difference']:.3f}); seed noise "
            f"(larger sd) {cmp['noise']:.3f}: async is "
            + ("within the seeds' spread or better" if cmp["within_noise"] else "WORSE beyond the seeds' spread"))


def curves_svg(runs: Sequence[tuple[str, str, Sequence[Mapping[str, float]]]], title: str, *, width: int = 800,
               height: int = 420, note: str = "") -> str:
    """Reward against cumulative rollout tokens, one polyline per run (``(label, mode,
    curve)``; colour by mode, ``MODE_COLORS``), as an SVG document (text), with a legend.

    Raises:
        ValueError: no run has a point, or the canvas is too small.
    """
    pts = [(p["rollout_tokens"], p["reward_mean"]) for _, _, c in runs for p in c if not math.isnan(p["reward_mean"])]
    if not pts:
        raise ValueError("no curve has a point to draw")
    if width < 300 or height < 200:
        raise ValueError(f"width={width} (>= 300 expected), height={height} (>= 200 expected)")
    left, right, top, bottom = 60, 150, 40 + (16 if note else 0), 50
    x_max = max(x for x, _ in pts) or 1.0
    y_lo, y_hi = min(0.0, min(y for _, y in pts)), max(1e-9, max(y for _, y in pts))
    y_hi += 0.05 * (y_hi - y_lo)
    sx = (width - left - right) / x_max
    sy = (height - top - bottom) / (y_hi - y_lo)

    def xy(x: float, y: float) -> str:
        return f"{left + x * sx:.1f},{height - bottom - (y - y_lo) * sy:.1f}"

    parts = svg_head(width, height, left, title, note)
    x0, y0 = left, height - bottom
    parts.append(f'<line x1="{x0}" y1="{y0}" x2="{width - right}" y2="{y0}" stroke="black"/>')
    parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{top}" stroke="black"/>')
    for k in range(6):
        y = y_lo + k * (y_hi - y_lo) / 5
        yy = height - bottom - (y - y_lo) * sy
        parts.append(f'<text x="{x0 - 6}" y="{yy + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        parts.append(f'<line x1="{x0}" y1="{yy:.1f}" x2="{width - right}" y2="{yy:.1f}" stroke="#eee"/>')
        x = k * x_max / 5
        parts.append(f'<text x="{left + x * sx:.1f}" y="{y0 + 16}" text-anchor="middle">{x:.0f}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 12}" text-anchor="middle">'
                 "cumulative rollout tokens</text>")
    parts.append(f'<text x="14" y="{(top + y0) / 2:.0f}" transform="rotate(-90 14 {(top + y0) / 2:.0f})" '
                 'text-anchor="middle">reward_mean</text>')
    for i, (label, mode, curve) in enumerate(runs):
        color = MODE_COLORS.get(mode, "#555")
        line = " ".join(xy(p["rollout_tokens"], p["reward_mean"]) for p in curve if not math.isnan(p["reward_mean"]))
        parts.append(f'<polyline class="curve" data-mode="{escape(mode)}" data-run="{escape(label)}" points="{line}" '
                     f'fill="none" stroke="{color}" stroke-width="1.5"><title>{escape(label)}</title></polyline>')
        ly = top + 16 * i
        parts.append(f'<line x1="{width - right + 10}" y1="{ly}" x2="{width - right + 30}" y2="{ly}" '
                     f'stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{width - right + 35}" y="{ly + 4}">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
