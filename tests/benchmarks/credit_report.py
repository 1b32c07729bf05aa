"""The pure part of ``tests/benchmarks/bench_credit.py``: from the runs' ``result.json`` files to
the comparison table, the paired differences, the diagnostics and the curves' points (the
picture itself: ``credit_plot.py``, the one module that imports matplotlib). No Ray, no model. Unit tests:
``tests/unit/benchmarks/test_bench_credit_report.py`` (synthetic result files).

A result file (``<out>/<suite>/<estimator>-s<seed>/result.json``, written by the bench when a run
finishes) holds ``suite``, ``estimator``, ``seed``, ``fingerprint``, ``complete`` (true),
``wall_s``, ``history`` (the run's ``metrics.jsonl`` rows, one per iteration) and
``eval_tasks`` (``{"before"|"after": {task_id: [1 or 0 per scored sample]}}``, from the replay
store's eval episodes) and, in files written since 7 December 2026, ``eval_behaviours``
(``{"before"|"after": [[action sequence, episodes, successes], ...]}``, the most common first).

Metric names read: ``tokens/generated`` (rollout tokens of the update; ``rollout/generated_tokens``
where absent), ``rollout/successes``, ``rollout/scored_episodes``, ``eval_before/pass@1`` and
``eval/pass@1`` with ``_low`` / ``_high`` (the run's own 95 % bootstrap over tasks),
``eval/iteration``, and the per-update diagnostics ``credit/turn_adv_differs_frac``,
``credit/multi_turn_frac``, ``credit/zero_grad_update``, ``actor/no_signal_steps``, ``gigpo/*``
(``agentrl.credit.diagnostics``) and ``critic/explained_variance``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["RESULT_NAME", "load_results", "tokens_of", "at_budget", "binomial_se", "eval_point", "held_out_curve",
           "paired_difference", "mean_interval", "diagnostics", "gigpo_diagnosis", "critic_diagnosis", "build_report",
           "format_behaviours",
           "format_summary", "format_report", "training_curve"]

RESULT_NAME = "result.json"
NO_BASELINE_FRAC = 0.75
"""``critic_diagnosis``: values off the returns by more than this share of the returns' size
give no baseline."""
BASELINE = "grpo"
COLORS = {"grpo": "#4e79a7", "gigpo": "#e15759", "turn_critic": "#59a14f"}
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
SMALL_STEP_RATIO = 0.1
"""GiGPO's step term counts as small when its mean ``|omega * A_S|`` is under this share of the mean
``|A_E|``."""
EMPTY_GROUPS_FRAC = 0.05
"""GiGPO's step groups count as empty when under this share of the steps after an episode's first
share a step group with another step."""


def load_results(out: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Every complete result file under ``out``, by suite (sorted by seed, then estimator).

    Raises:
        ValueError: a result file that is not JSON (the path is named).
    """
    by_suite: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(out).glob(f"*/*/{RESULT_NAME}")):
        try:
            res = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not JSON ({exc}); delete it to run that comparison again") from None
        if res.get("complete"):
            by_suite.setdefault(res["suite"], []).append(res)
    for runs in by_suite.values():
        runs.sort(key=lambda r: (r["seed"], r["estimator"]))
    return by_suite


def _num(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def tokens_of(row: Mapping[str, Any]) -> float:
    """Rollout tokens of one iteration (``tokens/generated``, else ``rollout/generated_tokens``, else 0)."""
    v = _num(row, "tokens/generated")
    return v if v is not None else (_num(row, "rollout/generated_tokens") or 0.0)


def _scored(row: Mapping[str, Any]) -> tuple[float, float]:
    """(successes, scored episodes) of one iteration: errored episodes are in neither."""
    if _num(row, "rollout/scored_episodes") is not None:
        return _num(row, "rollout/successes") or 0.0, float(row["rollout/scored_episodes"])
    rate, n = _num(row, "rollout/success_rate"), _num(row, "rollout/episodes") or 0.0
    return (rate * n, n) if rate is not None else (0.0, 0.0)


def at_budget(rows: Sequence[Mapping[str, Any]], budget: float) -> tuple[float, int, float, float]:
    """Training success rate within the first ``budget`` rollout tokens of a run.

    Iterations are taken in order; the one that crosses ``budget`` counts with the fraction of its
    tokens inside it (its successes and episodes scaled alike), so every run is measured on
    ``min(budget, its total)`` tokens.

    Returns:
        ``(success rate, iterations touched, tokens counted, episodes counted)``; rate 0.0 when no
        episode was scored.
    """
    cum, succ, eps, n = 0.0, 0.0, 0.0, 0
    for r in rows:
        if cum >= budget:
            break
        tokens = tokens_of(r)
        w = 1.0 if tokens <= 0 or cum + tokens <= budget else (budget - cum) / tokens
        s, e = _scored(r)
        succ += w * s
        eps += w * e
        cum += w * tokens
        n += 1
    return (succ / eps if eps else 0.0), n, cum, eps


def binomial_se(p: float, n: float) -> float:
    """Standard error of a rate ``p`` over ``n`` episodes taken as independent (the rollouts of one
    group share a task, so the true error is somewhat larger); NaN for ``n <= 0``."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n > 0 else float("nan")


def eval_point(history: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float] | None:
    """Held-out pass@1 of the first ``eval_before`` row or the last ``eval`` row: ``{"p", "low",
    "high", "iteration"}`` (iteration 0 before training); ``None`` when the run has none."""
    rows = [r for r in history if _num(r, f"{prefix}/pass@1") is not None]
    if not rows:
        return None
    r = rows[0] if prefix == "eval_before" else rows[-1]
    it = 0.0 if prefix == "eval_before" else (_num(r, "eval/iteration") or _num(r, "iteration") or 0.0)
    return {"p": float(r[f"{prefix}/pass@1"]), "low": _num(r, f"{prefix}/pass@1_low") or float("nan"),
            "high": _num(r, f"{prefix}/pass@1_high") or float("nan"), "iteration": it}


def held_out_curve(history: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, float, float]]:
    """``(rollout tokens so far, pass@1, low, high)`` of every held-out eval of a run, in order: the
    one before training at 0 tokens, then each ``eval/*`` at the tokens through the iteration it
    measured."""
    cum = np.cumsum([tokens_of(r) for r in history]) if history else np.zeros(0)
    its = [int(_num(r, "iteration") or i + 1) for i, r in enumerate(history)]
    out = []
    before = eval_point(history, "eval_before")
    if before is not None:
        out.append((0.0, before["p"], before["low"], before["high"]))
    for i, r in enumerate(history):
        p = _num(r, "eval/pass@1")
        if p is None:
            continue
        it = int(_num(r, "eval/iteration") or its[i])
        k = its.index(it) if it in its else i
        out.append((float(cum[k]), p, _num(r, "eval/pass@1_low") or float("nan"),
                    _num(r, "eval/pass@1_high") or float("nan")))
    return out


def paired_difference(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], *, seed: int = 0,
                      resamples: int = 2000, confidence: float = 0.95) -> dict[str, float] | None:
    """Held-out pass@1 of ``a`` minus that of ``b`` over the tasks both scored, with a paired
    bootstrap interval: tasks are resampled together, so the task-to-task spread (shared by two
    runs evaluated on the same tasks and sampling seeds) leaves the interval.

    Args:
        a, b: ``task_id -> [1 or 0 per scored sample]``.

    Returns:
        ``{"diff", "low", "high", "tasks", "differ", "both_solved", "both_failed"}``: the mean
        difference, its interval, the tasks compared, those whose pass rates differ, and those
        both runs solved in every sample or in none (a difference of exactly 0 with ``differ`` 0
        means the two policies behave alike task by task, not that the runs are the same);
        ``None`` when no task was scored by both.
    """
    tasks = sorted(t for t in a if t in b and len(a[t]) and len(b[t]))
    if not tasks:
        return None
    d = np.asarray([np.mean(a[t]) - np.mean(b[t]) for t in tasks], dtype=np.float64)  # [T]
    solved = sum(1 for t in tasks if min(a[t]) > 0 and min(b[t]) > 0)
    failed = sum(1 for t in tasks if max(a[t]) <= 0 and max(b[t]) <= 0)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)  # [B]
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return {"diff": float(d.mean()), "low": float(low), "high": float(high), "tasks": float(d.size),
            "differ": float(np.count_nonzero(d)), "both_solved": float(solved), "both_failed": float(failed)}


def mean_interval(values: Sequence[float]) -> dict[str, float]:
    """Mean of per-seed values with a two-sided 95 % t interval (NaN bounds for fewer than 2 values)."""
    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=np.float64)
    if v.size == 0:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0.0}
    if v.size < 2:
        return {"mean": float(v.mean()), "low": float("nan"), "high": float("nan"), "n": 1.0}
    df = v.size - 1
    t = _T95.get(df, 1.96 + 2.5 / df)
    half = t * float(v.std(ddof=1)) / math.sqrt(v.size)
    return {"mean": float(v.mean()), "low": float(v.mean() - half), "high": float(v.mean() + half),
            "n": float(v.size)}


def _mean_of(history: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = [_num(r, key) for r in history]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


def diagnostics(history: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Per-run means over its updates of the credit diagnostics; ``zero_grad_updates`` is the share
    of updates whose policy-gradient term was exactly 0 (``credit/zero_grad_update``; where absent,
    an update whose optimizer step was skipped for a zero gradient, ``actor/no_signal_steps > 0``).
    ``None`` where a run did not write the metric."""
    zero = [_num(r, "credit/zero_grad_update") for r in history]
    if any(z is None for z in zero):
        zero = [None if _num(r, "actor/no_signal_steps") is None else float(_num(r, "actor/no_signal_steps") > 0)
                for r in history]
    zero = [z for z in zero if z is not None]
    ev = [_num(r, "critic/explained_variance") for r in history]
    ev = [v for v in ev if v is not None]
    out: dict[str, float | None] = {
        "updates": float(len(history)),
        "zero_grad_updates": float(np.mean(zero)) if zero else None,
        "turn_adv_differs_frac": _mean_of(history, "credit/turn_adv_differs_frac"),
        "multi_turn_frac": _mean_of(history, "credit/multi_turn_frac"),
        "critic_ev_mean": float(np.mean(ev)) if ev else None,
        "critic_ev_last": ev[-1] if ev else None,
        "critic_values_last": _num(history[-1], "critic/values_mean") if history else None,
        "critic_returns_last": _num(history[-1], "critic/returns_mean") if history else None,
        "adv_mean": _mean_of(history, "advantages/mean"),
        "entropy_first": _num(history[0], "actor/entropy") if history else None,
        "entropy_last": _num(history[-1], "actor/entropy") if history else None,
        "turns_first": _num(history[0], "rollout/turns_mean") if history else None,
        "turns_last": _num(history[-1], "rollout/turns_mean") if history else None,
    }
    for k in ("step_group_size_mean", "steps_in_groups_ge2_frac", "later_steps_in_groups_ge2_frac",
              "step_adv_abs_mean", "episode_adv_abs_mean", "step_adv_nonzero_frac"):
        out[f"gigpo_{k}"] = _mean_of(history, f"gigpo/{k}")
    return out


def gigpo_diagnosis(d: Mapping[str, float | None]) -> str:
    """Why GiGPO's credit did or did not differ from GRPO's, from its run's ``diagnostics``: its step
    groups were empty (under ``EMPTY_GROUPS_FRAC`` of the later steps in a group of >= 2), its step
    advantages small (mean ``|omega A_S|`` under ``SMALL_STEP_RATIO`` of mean ``|A_E|``), or it had
    a step term of its own; or every episode had one turn in the loss (``multi_turn_frac`` 0)."""
    later, step, ep = d.get("gigpo_later_steps_in_groups_ge2_frac"), d.get("gigpo_step_adv_abs_mean"), \
        d.get("gigpo_episode_adv_abs_mean")
    if later is None or step is None:
        return "no gigpo/* metrics in this run"
    sizes = (f"{100 * (d.get('gigpo_steps_in_groups_ge2_frac') or 0):.0f}% of steps in step groups of >= 2 "
             f"({100 * later:.0f}% of the steps after the first), mean group size "
             f"{d.get('gigpo_step_group_size_mean') or 0:.2f}; |omega A_S| {step:.3f} vs |A_E| {ep or 0:.3f}")
    if d.get("multi_turn_frac") == 0.0:
        return f"one-turn episodes only (no step after the first, so no step group of its own): {sizes}"
    if later < EMPTY_GROUPS_FRAC:
        return f"step groups empty beyond the shared first state: {sizes}"
    if ep and step < SMALL_STEP_RATIO * ep or not ep and step < 1e-9:
        return f"step advantages small: {sizes}"
    return f"step term present: {sizes}"


def build_report(by_suite: Mapping[str, Sequence[Mapping[str, Any]]], *, seed: int = 0) -> dict[str, Any]:
    """The comparison, per suite: one row per run, the paired differences against GRPO of the same
    seed (held-out pass@1 after training, bootstrap over tasks; training success within the
    seed's equal budget ``B``, the smallest total of rollout tokens among that seed's runs), and per
    estimator the mean over seeds with a t interval and the verdict (``separated`` only when every
    seed's paired interval excludes 0 on the same side).

    Returns:
        ``{suite: {"rows": [...], "pooled": {estimator: {...}}, "fingerprints": [...]}}``.
    """
    report: dict[str, Any] = {}
    for suite, runs in by_suite.items():
        by_seed: dict[int, dict[str, Mapping[str, Any]]] = {}
        for r in runs:
            by_seed.setdefault(int(r["seed"]), {})[r["estimator"]] = r
        rows = []
        for s, ests in sorted(by_seed.items()):
            budget = min(sum(tokens_of(x) for x in r["history"]) for r in ests.values())
            base = ests.get(BASELINE)
            base_rate = at_budget(base["history"], budget)[0] if base else None
            for est, r in sorted(ests.items(), key=lambda kv: (kv[0] != BASELINE, kv[0])):
                h = r["history"]
                total = sum(tokens_of(x) for x in h)
                rate, n_it, used, eps = at_budget(h, budget)
                row = {"seed": s, "estimator": est, "tokens": total, "budget": budget, "tokens_over_budget":
                       total / budget - 1.0 if budget else 0.0, "before": eval_point(h, "eval_before"),
                       "after": eval_point(h, "eval"), "train_at_budget": rate, "train_at_budget_se":
                       binomial_se(rate, eps), "wall_s": r.get("wall_s"), "diag": diagnostics(h),
                       "diff_after": None, "diff_train": None}
                if base is not None and est != BASELINE:
                    row["diff_after"] = paired_difference(r.get("eval_tasks", {}).get("after", {}),
                                                          base.get("eval_tasks", {}).get("after", {}), seed=seed)
                    row["diff_train"] = rate - base_rate
                if est == "gigpo":
                    row["gigpo_diagnosis"] = gigpo_diagnosis(row["diag"])
                rows.append(row)
        pooled = {}
        for est in sorted({r["estimator"] for r in rows}):
            mine = [r for r in rows if r["estimator"] == est]
            diffs = [r["diff_after"] for r in mine if r["diff_after"]]
            sides = {(-1 if d["high"] < 0 else 1) for d in diffs if d["low"] > 0 or d["high"] < 0}
            separated = bool(diffs) and len(sides) == 1 and all(d["low"] > 0 or d["high"] < 0 for d in diffs)
            pooled[est] = {
                "seeds": len(mine),
                "after": mean_interval([r["after"]["p"] for r in mine if r["after"]]),
                "diff_after": mean_interval([d["diff"] for d in diffs]),
                "diff_train": mean_interval([r["diff_train"] for r in mine if r["diff_train"] is not None]),
                "separated": ("better" if sides == {1} else "worse") if separated else None,
                "zero_grad_updates": mean_interval([r["diag"]["zero_grad_updates"] for r in mine
                                                    if r["diag"]["zero_grad_updates"] is not None])["mean"],
            }
        report[suite] = {"rows": rows, "pooled": pooled,
                         "fingerprints": sorted({str(r.get("fingerprint")) for r in runs})}
    return report


def _pct(p: Mapping[str, float] | None) -> str:
    if not p:
        return "-"
    lo, hi = p.get("low", float("nan")), p.get("high", float("nan"))
    return f"{p['p']:.3f} [{lo:.3f}, {hi:.3f}]" if not math.isnan(lo) else f"{p['p']:.3f}"


def _diff(d: Mapping[str, float] | None) -> str:
    if not d:
        return "-"
    out = f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
    if "differ" in d:  # result files of the first format lack the counts
        out += (f"; differ on {d['differ']:.0f} of {d['tasks']:.0f} tasks (both: {d['both_solved']:.0f} solved in "
                f"every sample, {d['both_failed']:.0f} in none)")
    return out


def _frac(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _over_seeds(m: Mapping[str, float], fmt: str) -> str:
    """A ``mean_interval`` as text: the mean, and its 95 % t interval over seeds when there are two or more."""
    if not m["n"]:
        return "-"
    if math.isnan(m["low"]):
        return f"{m['mean']:{fmt}} (one seed, no interval over seeds)"
    return f"{m['mean']:{fmt}} [{m['low']:{fmt}}, {m['high']:{fmt}}] (95% t interval over seeds)"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: its own ``|`` (``|omega A_S|``) would end the cell."""
    return text.replace("|", "\\|")


def _estimator_note(row: Mapping[str, Any]) -> str:
    d = row["diag"]
    if row["estimator"] == "gigpo":
        return "; ".join(x for x in (row.get("gigpo_diagnosis", ""), _drift(d)) if x)
    if row["estimator"] == "turn_critic":
        return critic_diagnosis(d)
    return _drift(d)


def _drift(d: Mapping[str, float | None]) -> str:
    """How the policy moved over the run: its entropy and turns per episode, first update to last."""
    parts = []
    if d.get("entropy_first") is not None and d.get("entropy_last") is not None:
        parts.append(f"entropy {d['entropy_first']:.3f} -> {d['entropy_last']:.3f}")
    if d.get("turns_first") is not None and d.get("turns_last") is not None:
        parts.append(f"turns per episode {d['turns_first']:.2f} -> {d['turns_last']:.2f}")
    return "; ".join(parts)


def critic_diagnosis(d: Mapping[str, float | None]) -> str:
    """The turn critic's run, from its ``diagnostics``: the explained variance of its values, and
    whether at the last update its values were still far from the returns (off by more than
    ``NO_BASELINE_FRAC`` of the returns' size): such a critic gives no baseline, the advantages
    are about the returns, nearly all >= 0 with rewards in [0, 1], so every sampled step of a
    rewarded episode is pushed up."""
    if d.get("critic_ev_mean") is None:
        return "no critic/explained_variance"
    out = f"critic explained variance mean {d['critic_ev_mean']:.3f}, last {d['critic_ev_last']:.3f}"
    v, g, a = d.get("critic_values_last"), d.get("critic_returns_last"), d.get("adv_mean")
    if v is not None and g is not None and abs(g - v) > NO_BASELINE_FRAC * abs(g):
        out += f"; last values {v:+.3f} against returns {g:+.3f}: no baseline yet"
        if a is not None:
            out += f", the advantages are about the returns (mean {a:+.3f})"
    drift = _drift(d)
    return f"{out}; {drift}" if drift else out


def format_summary(report: Mapping[str, Any]) -> str:
    """The short table (the README's): per suite, seed and estimator the held-out pass@1 before and
    after with their intervals, the paired difference to GRPO, and training success within ``B``."""
    out = ["| suite | seed | estimator | held-out pass@1 before | after | after - GRPO (paired) "
           "| train success within B |", "|---|---|---|---|---|---|---|"]
    for suite, rep in report.items():
        for r in rep["rows"]:
            d = r["diff_after"]
            diff = "-" if not d else f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
            out.append(f"| {suite} | {r['seed']} | {r['estimator']} | {_pct(r['before'])} | {_pct(r['after'])} | "
                       f"{diff} | {r['train_at_budget']:.3f} +- {r['train_at_budget_se']:.3f} |")
    return "\n".join(out)


def format_report(report: Mapping[str, Any]) -> str:
    """The report as Markdown: per suite the table of every run, the pooled line per estimator and
    what separated; notes for fingerprints that differ and for runs whose after-eval came after
    more than the seed's equal budget."""
    out = []
    for suite, rep in report.items():
        out.append(f"### {suite}\n")
        if len(rep["fingerprints"]) > 1:
            out.append(f"**Warning:** result files of {len(rep['fingerprints'])} different settings "
                       f"({', '.join(rep['fingerprints'])}) are mixed in this suite.\n")
        out.append("| seed | estimator | rollout tokens (B) | held-out pass@1 before | after | after - GRPO (paired) "
                   "| train success within B | - GRPO | turns with own credit | updates without gradient "
                   "| diagnosis |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rep["rows"]:
            over = f" (+{100 * r['tokens_over_budget']:.0f}%)" if r["tokens_over_budget"] > 0.005 else ""
            dt = "-" if r["diff_train"] is None else f"{r['diff_train']:+.3f}"
            out.append(f"| {r['seed']} | {r['estimator']} | {r['tokens']:,.0f}{over} ({r['budget']:,.0f}) | "
                       f"{_pct(r['before'])} | {_pct(r['after'])} | {_diff(r['diff_after'])} | "
                       f"{r['train_at_budget']:.3f} +- {r['train_at_budget_se']:.3f} | {dt} | "
                       f"{_frac(r['diag']['turn_adv_differs_frac'])} of {_frac(r['diag']['multi_turn_frac'])} | "
                       f"{_frac(r['diag']['zero_grad_updates'])} | {_cell(_estimator_note(r))} |")
        out.append("")
        for est, p in sorted(rep["pooled"].items(), key=lambda kv: (kv[0] != BASELINE, kv[0])):
            a, d, t = p["after"], p["diff_after"], p["diff_train"]
            line = (f"- **{est}** ({p['seeds']} seed{'s' if p['seeds'] != 1 else ''}): held-out pass@1 after "
                    f"{_over_seeds(a, '.3f')}; updates without gradient {_frac(p['zero_grad_updates'])}")
            if est != BASELINE and d["n"]:
                verdict = (f"**separated from GRPO ({p['separated']}) in every seed**" if p["separated"]
                           else "not separated from GRPO")
                line += (f"; after - GRPO {_over_seeds(d, '+.3f')}, training success within B - GRPO "
                         f"{_over_seeds(t, '+.3f')}: {verdict}")
            out.append(line)
        over = [r for r in rep["rows"] if r["tokens_over_budget"] > 0.1]
        if over:
            out.append(f"- Note: {len(over)} run(s) generated over 10% more rollout tokens than their seed's B before "
                       "the after-eval; their held-out pass@1 is at their own total, not at B.")
        out.append("")
    out.append("Intervals: held-out pass@1, the run's 95% bootstrap over tasks; paired differences, 95% bootstrap "
               "over the tasks both runs scored (same tasks, same sampling seeds); over seeds, a 95% t interval. "
               "B is the smallest rollout-token total among a seed's runs; training success within B counts the "
               "iteration crossing B pro rata (+- one binomial standard error). 'Turns with own credit': share of "
               "turns whose advantage differs from their episode's mean, of the share of turns in multi-turn "
               "episodes.")
    return "\n".join(out)


def training_curve(history: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """``(rollout tokens through the iteration, its training success rate)`` per iteration with a
    scored episode."""
    out, cum = [], 0.0
    for r in history:
        cum += tokens_of(r)
        s, e = _scored(r)
        if e > 0:
            out.append((cum, s / e))
    return out


def _behaviour_line(top: Sequence[Sequence[Any]], shown: int) -> str:
    """``top``'s first ``shown`` sequences as ``\`a -> b\` xN (K solved)`` (list items, not table
    cells: a ``|`` stays as it is); a backquote in an action becomes ``'`` so the code span holds,
    and whitespace runs become one space so it stays on one line."""
    parts = []
    for seq, n, ok in top[:shown]:
        text = " ".join(str(seq).replace("`", "'").split()) or "(no action)"
        parts.append(f"`{text}` x{int(n)} ({int(ok)} solved)")
    return "; ".join(parts) or "-"


def format_behaviours(by_suite: Mapping[str, Sequence[Mapping[str, Any]]], shown: int = 3) -> str:
    """What each policy does on the held-out tasks: per suite and seed, the most common action
    sequences of the eval before training (once: every estimator starts from the same weights and
    sampling seeds) and after, per estimator, with how many episodes took each and how many of
    those succeeded (``eval_behaviours``; runs without it are left out). The mechanism behind a
    number, e.g. a policy that learned a fixed guess order instead of reading the feedback."""
    out = []
    for suite, runs in by_suite.items():
        by_seed: dict[int, list[Mapping[str, Any]]] = {}
        for r in runs:
            if r.get("eval_behaviours"):
                by_seed.setdefault(int(r["seed"]), []).append(r)
        if not by_seed:
            continue
        out.append(f"### {suite}\n")
        for seed, mine in sorted(by_seed.items()):
            mine = sorted(mine, key=lambda r: (r["estimator"] != BASELINE, r["estimator"]))
            n_before = sum(sum(len(v) for v in r["eval_tasks"].get("before", {}).values()) for r in mine[:1])
            out.append(f"- seed {seed}, before training ({n_before} episodes): "
                       f"{_behaviour_line(mine[0]['eval_behaviours'].get('before', []), shown)}")
            for r in mine:
                n = sum(len(v) for v in r["eval_tasks"].get("after", {}).values())
                out.append(f"- seed {seed}, **{r['estimator']}** after ({n} episodes): "
                           f"{_behaviour_line(r['eval_behaviours'].get('after', []), shown)}")
        out.append("")
    return "\n".join(out)
