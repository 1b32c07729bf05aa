"""The picture of ``tests/benchmarks/bench_credit.py --report``: per suite (a column), training
success and held-out pass@1 against cumulative rollout tokens (two rows), one colour per
estimator, a thin line per seed and a thick one for the mean over seeds (at each iteration, the
mean of the seeds' token counts and rates), the held-out evals with their 95 % intervals, and the
seeds' equal budgets ``B`` as dotted lines. The one module of the bench that imports matplotlib
(Agg backend, inside ``plot_curves``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from credit_report import COLORS, held_out_curve, tokens_of, training_curve


def plot_curves(by_suite: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path) -> Path:
    """Write the PNG to ``path`` (its folder is created) and return it.

    Raises:
        ValueError: no run to draw.
    """
    import matplotlib  # the report path only: the bench's runs never import it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not by_suite:
        raise ValueError("no complete result.json to draw; run the comparison first")
    suites = list(by_suite)
    fig, axes = plt.subplots(2, len(suites), figsize=(6.0 * len(suites), 8.0), squeeze=False)
    for col, suite in enumerate(suites):
        runs = by_suite[suite]
        top, bottom = axes[0][col], axes[1][col]
        for est in sorted({r["estimator"] for r in runs}):
            color = COLORS.get(est, "#777777")
            mine = [r for r in runs if r["estimator"] == est]
            curves = [training_curve(r["history"]) for r in mine]
            for c in curves:
                if c:
                    top.plot(*zip(*c), color=color, alpha=0.3, linewidth=0.8)
            n = min((len(c) for c in curves if c), default=0)
            if n:
                xs = np.mean([[p[0] for p in c[:n]] for c in curves if c], axis=0)
                ys = np.mean([[p[1] for p in c[:n]] for c in curves if c], axis=0)
                top.plot(xs, ys, color=color, linewidth=2.2, marker="o", markersize=3,
                         label=f"{est} ({len(mine)} seed{'s' if len(mine) != 1 else ''})")
            for k, r in enumerate(mine):
                pts = held_out_curve(r["history"])
                if not pts:
                    continue
                x, p, lo, hi = (np.asarray(v, dtype=float) for v in zip(*pts))
                jitter = (k - (len(mine) - 1) / 2) * 0.01 * max(float(x.max()), 1.0)
                err = np.vstack([np.nan_to_num(p - lo), np.nan_to_num(hi - p)])
                bottom.errorbar(x + jitter, p, yerr=err, color=color, alpha=0.8, marker="o", markersize=4,
                                capsize=2, linewidth=1.0, label=est if k == 0 else None)
        budgets = sorted({min(sum(tokens_of(x) for x in r["history"]) for r in runs if r["seed"] == s)
                          for s in {r["seed"] for r in runs}})
        for b in budgets:
            for ax in (top, bottom):
                ax.axvline(b, color="#999999", linestyle=":", linewidth=0.8)
        top.set_title(f"{suite}: training success per iteration")
        bottom.set_title(f"{suite}: held-out pass@1 (95% intervals), before and after")
        for ax in (top, bottom):
            ax.set_xlabel("rollout tokens (cumulative)")
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlim(left=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="best")
        top.set_ylabel("success rate")
        bottom.set_ylabel("pass@1")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
