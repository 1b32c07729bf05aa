"""The credit benchmark's equal-budget arithmetic (``tests/benchmarks/credit_report.py``):
the iteration crossing the budget counts pro rata, and errored episodes are not scored."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "credit_report.py"
_spec = importlib.util.spec_from_file_location("credit_report_budget", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _row(tokens, successes, scored, episodes=None):
    return {"tokens/generated": tokens, "rollout/successes": successes, "rollout/scored_episodes": scored,
            "rollout/episodes": episodes if episodes is not None else scored,
            "rollout/success_rate": successes / scored if scored else None}


def test_crossing_iteration_counts_pro_rata():
    # A: 8 iterations of 100 tokens, 1/10 successes each. C: 100 tokens, then 300 per iteration.
    a = [_row(100, 1, 10)] * 8
    c = [_row(100, 1, 10), _row(300, 2, 10), _row(300, 5, 10), _row(300, 9, 10)]
    rate_a, n_a, used_a, eps_a = bench.at_budget(a, 800)
    rate_c, n_c, used_c, eps_c = bench.at_budget(c, 800)
    assert (rate_a, n_a, used_a, eps_a) == (pytest.approx(0.1), 8, 800, 80)
    # C within 800 tokens: all of iterations 1-3 (700 tokens) and 100/300 of iteration 4
    assert used_c == pytest.approx(800) and n_c == 4
    assert eps_c == pytest.approx(30 + 10 / 3)
    assert rate_c == pytest.approx((1 + 2 + 5 + 9 / 3) / (30 + 10 / 3))


def test_errored_episodes_are_not_in_the_denominator():
    rows = [_row(100, 4, 8, episodes=8), _row(100, 4, 8, episodes=16)]  # 8 errored in iteration 2
    rate, _, _, eps = bench.at_budget(rows, 1000)
    assert rate == pytest.approx(0.5) and eps == 16
    # a metrics file without the counts (older runs): success_rate x episodes; an all-errored
    # iteration (success_rate NaN) contributes nothing
    old = [{"tokens/generated": 100, "rollout/episodes": 10, "rollout/success_rate": 0.5},
           {"tokens/generated": 100, "rollout/episodes": 10, "rollout/success_rate": float("nan")}]
    assert bench.at_budget(old, 1000)[0] == pytest.approx(0.5) and bench.at_budget(old, 1000)[3] == 10


def test_binomial_se():
    assert bench.binomial_se(0.5, 100) == pytest.approx(0.05)
    assert bench.binomial_se(0.0, 10) == 0.0
