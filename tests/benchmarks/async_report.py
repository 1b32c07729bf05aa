"""The pure parts of ``tests/benchmarks/bench_async.py``: from a run's per-iteration metrics
(``metrics.jsonl``, one dict per iteration) to throughput, the ideal pipelined bound, the
staleness histogram, the learning curve and an SVG timeline. No Ray, no model, no new
dependency (the SVG is written as text); unit tests in
``tests/unit/benchmarks/test_bench_async_report.py``.

Metric names read (written by ``agentrl.driver.controller`` in both modes):

* ``timeline/<phase>_start_s`` / ``timeline/<phase>_end_s``: wall seconds since ``train()``
  started, phases ``rollout`` (async: the update's wait for complete groups), ``credit``,
  ``update``, ``sync``, ``checkpoint``. A run without them (a controller older than issue
  12) gets spans laid end to end from ``time/<phase>_s`` and ``time/iteration_s``, marked
  ``reconstructed``.
* ``rollout/episodes``, ``rollout/aborted_episodes``, ``rollout/generated_tokens``,
  ``rollout/reward_mean``, ``rollout/success_rate``, ``rollout/scored_episodes``,
  ``rollout/successes``, ``tokens/trained``.
* ``async/staleness_hist/<d>``: trained rows of staleness ``d`` (policy versions) per update.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from xml.sax.saxutils import escape


def svg_head(width: int, height: int, left: float, title: str, note: str | None = None) -> list[str]:
    """The opening elements every bench picture starts with (svg element, white background,
    title at x=left, optional grey note line); the caller appends its shapes and ``</svg>``."""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>']
    if note:
        parts.append(f'<text x="{left}" y="36" fill="#555">{escape(note)}</text>')
    return parts

__all__ = ["PHASES", "PHASE_COLORS", "Span", "load_metrics", "phase_spans", "throughput", "ideal_pipelined_bound",
           "staleness_histogram", "format_histogram", "learning_curve", "success_within_budget", "nice_tick_step",
           "timeline_svg"]

PHASES = ("rollout", "credit", "update", "sync", "checkpoint")
PHASE_COLORS = {"rollout": "#4e79a7", "credit": "#f28e2b", "update": "#e15759", "sync": "#76b7b2",
                "checkpoint": "#9c9c9c"}
HIST_PREFIX = "async/staleness_hist/"

Span = tuple[int, str, float, float]
"""``(iteration, phase, start_s, end_s)``: iteration 1-based, seconds since ``train()`` started."""


def load_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The iterations of a ``metrics.jsonl`` in file order (blank lines skipped).

    Raises:
        ValueError: a line is not a JSON object (the message names the file and line).
    """
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object per line, got {type(rec).__name__}")
        out.append(rec)
    return out


def _num(m: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    v = m.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else default


def phase_spans(history: Sequence[Mapping[str, Any]]) -> tuple[list[Span], bool]:
    """Every phase of every iteration as a span, and whether they were reconstructed.

    From ``timeline/*`` when the first iteration has any; a phase whose start or end is
    missing in an iteration is left out. Otherwise (``reconstructed`` True) each iteration
    starts where the previous one's ``time/iteration_s`` ended and its phases rollout, credit,
    update, sync follow one another with their ``time/<phase>_s`` durations.

    Raises:
        ValueError: a recorded span ends before it starts.
    """
    spans: list[Span] = []
    has_timeline = bool(history) and any(k.startswith("timeline/") for k in history[0])
    if has_timeline:
        for i, m in enumerate(history):
            it = int(_num(m, "iteration", i + 1))
            for p in PHASES:
                s, e = m.get(f"timeline/{p}_start_s"), m.get(f"timeline/{p}_end_s")
                if not isinstance(s, (int, float)) or not isinstance(e, (int, float)):
                    continue
                if e < s:
                    raise ValueError(f"iteration {it}: timeline/{p}_end_s={e} is before timeline/{p}_start_s={s}")
                spans.append((it, p, float(s), float(e)))
        return spans, False
    t = 0.0
    for i, m in enumerate(history):
        it = int(_num(m, "iteration", i + 1))
        cur = t
        for p in ("rollout", "credit", "update", "sync"):
            d = _num(m, f"time/{p}_s")
            spans.append((it, p, cur, cur + d))
            cur += d
        t += max(_num(m, "time/iteration_s"), cur - t)
    return spans, True


def throughput(history: Sequence[Mapping[str, Any]], spans: Sequence[Span]) -> dict[str, float]:
    """Work per wall second of the training loop.

    ``wall_s`` runs from the first span's start to the last end of a phase other than
    ``checkpoint`` (the run's final checkpoint, which both modes write, is left out; start-up
    before the first iteration too). ``episodes``: episodes rolled out to an end (aborted
    attempts, whose engine was lost, not counted); ``trained_tokens``: ``tokens/trained``
    (loss tokens); ``rollout_tokens``: ``rollout/generated_tokens``.

    Raises:
        ValueError: no spans, or a wall time of 0.
    """
    work = [s for s in spans if s[1] != "checkpoint"]
    if not work:
        raise ValueError("no timeline spans: the run recorded no iteration")
    wall = max(s[3] for s in work) - min(s[2] for s in work)
    if wall <= 0:
        raise ValueError(f"wall time {wall} s of the training loop; expected > 0")
    episodes = sum(_num(m, "rollout/episodes") - _num(m, "rollout/aborted_episodes") for m in history)
    trained = sum(_num(m, "tokens/trained") for m in history)
    generated = sum(_num(m, "rollout/generated_tokens") for m in history)
    return {"iterations": float(len(history)), "wall_s": wall, "episodes": episodes, "trained_tokens": trained,
            "rollout_tokens": generated, "episodes_per_s": episodes / wall, "trained_tokens_per_s": trained / wall,
            "rollout_tokens_per_s": generated / wall}


def ideal_pipelined_bound(history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The speed-up a perfect two-stage pipeline would give a synchronous run's rounds.

    Per round ``r`` (seconds, from ``time/*``): ``rollout_r`` and the trainer side
    ``train_r = credit_r + update_r + sync_r`` (credit runs on the driver between the two and
    belongs to neither engine work nor idle time). Lock-step costs ``sum_r (rollout_r +
    train_r)``; pipelined, each round costs its slowest stage, ``sum_r max(rollout_r,
    train_r)`` (the ideal two-stage pipeline). ``bound`` is their ratio (>= 1). It prices overlap
    only: an asynchronous run that also keeps more episodes in flight (up to
    ``(max_staleness + 1) * tasks_per_iteration`` groups) can beat it when rollout time is
    mostly waiting (environment latency) rather than compute.

    Raises:
        ValueError: no rounds, or all of them took no time.
    """
    if not history:
        raise ValueError("no rounds to bound")
    rounds = []
    for m in history:
        r = _num(m, "time/rollout_s")
        t = _num(m, "time/credit_s") + _num(m, "time/update_s") + _num(m, "time/sync_s")
        rounds.append({"rollout_s": r, "train_s": t, "sum_s": r + t, "slowest_s": max(r, t)})
    total = sum(x["sum_s"] for x in rounds)
    piped = sum(x["slowest_s"] for x in rounds)
    if piped <= 0:
        raise ValueError("every round took 0 s; nothing to bound")
    return {"rounds": rounds, "lockstep_s": total, "pipelined_s": piped, "bound": total / piped}


def staleness_histogram(history: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """Trained rows per staleness ``d`` (policy versions behind the trainer at the update),
    summed over iterations from ``async/staleness_hist/<d>``; ``{}`` when no iteration
    recorded one (a synchronous run: every row is on-policy).

    Raises:
        ValueError: a key whose ``<d>`` is not a non-negative integer, or a negative count.
    """
    hist: dict[int, int] = {}
    for m in history:
        for k, v in m.items():
            if not k.startswith(HIST_PREFIX) or v is None:
                continue
            d = k[len(HIST_PREFIX):]
            if not d.isdigit():
                raise ValueError(f"metric {k!r}: staleness {d!r} is not a non-negative integer")
            if v < 0:
                raise ValueError(f"metric {k!r}={v}: a count must be >= 0")
            hist[int(d)] = hist.get(int(d), 0) + int(round(v))
    return dict(sorted(hist.items()))


def format_histogram(hist: Mapping[int, int], width: int = 40) -> list[str]:
    """One text line per staleness from 0 to the largest one seen: the count, its share and
    a bar of at most ``width`` characters (``#``), e.g. ``  d=1    12  37.5%  ######``."""
    if not hist:
        return ["  (no staleness recorded)"]
    total = sum(hist.values())
    peak = max(hist.values())
    lines = []
    for d in range(0, max(hist) + 1):
        n = hist.get(d, 0)
        bar = "#" * (round(width * n / peak) if peak else 0)
        lines.append(f"  d={d:<3d} {n:6d} {100.0 * n / total if total else 0.0:5.1f}%  {bar}")
    return lines


def learning_curve(history: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Per iteration: cumulative ``rollout/generated_tokens`` up to and including it, its
    ``rollout/reward_mean`` and ``rollout/success_rate`` (NaN when it scored no episode)."""
    out, cum = [], 0.0
    for i, m in enumerate(history):
        cum += _num(m, "rollout/generated_tokens")
        out.append({"iteration": _num(m, "iteration", i + 1), "rollout_tokens": cum,
                    "reward_mean": _num(m, "rollout/reward_mean", math.nan),
                    "success_rate": _num(m, "rollout/success_rate", math.nan)})
    return out


def success_within_budget(history: Sequence[Mapping[str, Any]], budget_tokens: float) -> dict[str, float]:
    """Success rate over the scored episodes of the iterations whose cumulative
    ``rollout/generated_tokens`` stays within ``budget_tokens`` (whole iterations; at least
    the first), ± one binomial standard error (episodes treated as independent; the rollouts
    of a group share a task, so the true error is somewhat larger). Two runs compared at the
    same budget (the smaller of their totals) compare learning per rollout token.

    Returns:
        ``{"success_rate", "se", "episodes", "rollout_tokens", "iterations"}``; NaN rate
        when no episode was scored.
    """
    succ = eps = cum = 0.0
    n = 0
    for m in history:
        tokens = _num(m, "rollout/generated_tokens")
        if n and cum + tokens > budget_tokens:
            break
        cum += tokens
        eps += _num(m, "rollout/scored_episodes")
        succ += _num(m, "rollout/successes")
        n += 1
    rate = succ / eps if eps else math.nan
    se = math.sqrt(max(rate * (1.0 - rate), 0.0) / eps) if eps else math.nan
    return {"success_rate": rate, "se": se, "episodes": eps, "rollout_tokens": cum, "iterations": float(n)}


def nice_tick_step(span_s: float, target_ticks: int = 10) -> float:
    """The tick spacing among 1, 2, 5 x 10^n that gives about ``target_ticks`` ticks over
    ``span_s`` seconds (1.0 for a non-positive span)."""
    if not span_s > 0:
        return 1.0
    raw = span_s / max(1, target_ticks)
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * mag >= raw:
            return m * mag
    return 10.0 * mag  # pragma: no cover - the loop always returns


def timeline_svg(spans: Sequence[Span], title: str, *, t0_s: float = 0.0, t_max_s: float | None = None,
                 width: int = 1000, lane_h: int = 24, note: str = "") -> str:
    """A per-phase timeline as an SVG document (text): one lane per phase present (in
    ``PHASES`` order), one bar per span from its start to its end (hover: iteration and
    times since ``train()`` started), iteration numbers in bars wide enough, and an axis of
    seconds since ``t0_s`` (e.g. the first iteration's start, leaving start-up out) from 0 to
    ``t_max_s`` (default: the last end), so two runs drawn with the same ``t_max_s`` compare
    by eye.

    Raises:
        ValueError: ``width`` or ``lane_h`` too small to draw in.
    """
    if width < 200 or lane_h < 8:
        raise ValueError(f"width={width} (>= 200 expected), lane_h={lane_h} (>= 8 expected)")
    hover = list(spans)
    spans = [(it, p, s - t0_s, e - t0_s) for it, p, s, e in spans]
    lanes = [p for p in PHASES if any(s[1] == p for s in spans)] or list(PHASES[:4])
    left, right, top = 90, 20, 40 + (16 if note else 0)
    end = max([s[3] for s in spans], default=0.0)
    t_max = t_max_s if t_max_s and t_max_s > 0 else (end if end > 0 else 1.0)
    scale = (width - left - right) / t_max
    axis_y = top + lane_h * len(lanes) + 4
    height = axis_y + 36
    parts = svg_head(width, height, left, title, note)
    for i, p in enumerate(lanes):
        y = top + i * lane_h
        parts.append(f'<text x="{left - 8}" y="{y + lane_h * 0.65:.1f}" text-anchor="end">{p}</text>')
        parts.append(f'<line x1="{left}" y1="{y + lane_h}" x2="{width - right}" y2="{y + lane_h}" stroke="#eee"/>')
    for (it, p, s, e), (_, _, s_abs, e_abs) in zip(spans, hover):
        if p not in lanes:
            continue
        y = top + lanes.index(p) * lane_h + 3
        x, w = left + s * scale, max(1.0, (e - s) * scale)
        parts.append(f'<rect class="span" data-phase="{p}" data-iteration="{it}" x="{x:.2f}" y="{y}" '
                     f'width="{w:.2f}" height="{lane_h - 6}" fill="{PHASE_COLORS[p]}">'
                     f'<title>iteration {it} {p}: {s_abs:.2f} s to {e_abs:.2f} s ({e - s:.2f} s)</title></rect>')
        if w >= 14:
            parts.append(f'<text x="{x + w / 2:.2f}" y="{y + (lane_h - 6) * 0.75:.1f}" text-anchor="middle" '
                         f'fill="white" font-size="10">{it}</text>')
    parts.append(f'<line x1="{left}" y1="{axis_y}" x2="{width - right}" y2="{axis_y}" stroke="black"/>')
    step = nice_tick_step(t_max)
    k = 0
    while k * step <= t_max * (1 + 1e-9):
        x = left + k * step * scale
        parts.append(f'<line x1="{x:.2f}" y1="{axis_y}" x2="{x:.2f}" y2="{axis_y + 5}" stroke="black"/>')
        parts.append(f'<text x="{x:.2f}" y="{axis_y + 18}" text-anchor="middle">{k * step:g}</text>')
        k += 1
    since = "train() started" if t0_s == 0 else f"the first iteration started ({t0_s:.1f} s after train() did)"
    parts.append(f'<text x="{width - right}" y="{axis_y + 32}" text-anchor="end">seconds since {escape(since)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
