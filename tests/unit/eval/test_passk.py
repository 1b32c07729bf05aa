"""pass@k (Chen et al. 2021, Sec. 2.1), bootstrap intervals over tasks, and the eval report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentrl.errors import ConfigError
from agentrl.eval.passk import bootstrap_interval, pass_at_k, summarize, task_outcomes
from agentrl.types import Episode, TerminationReason, Turn


def _comb_pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize("n,c,k,expected", [
    (2, 1, 1, 0.5),
    (2, 1, 2, 1.0),             # C(1,2) = 0: both samples drawn, the success is among them
    (5, 2, 2, 1 - 3 / 10),      # 1 - C(3,2)/C(5,2)
    (10, 3, 5, 1 - 21 / 252),   # 1 - C(7,5)/C(10,5) = 11/12
    (4, 0, 2, 0.0),
    (4, 4, 3, 1.0),
    (3, 1, 2, 1 - 1 / 3),       # 1 - C(2,2)/C(3,2)
    (200, 1, 100, 0.5),         # C(199,100)/C(200,100) = 100/200
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_the_success_fraction_and_the_product_matches_the_binomials():
    for n in range(1, 31):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_comb_pass_at_k(n, c, k), abs=1e-10), (n, c, k)


def test_pass_at_k_is_stable_where_binomials_overflow_a_float():
    # C(5000, 2500) ~ 1e1503 overflows float64; the product stays exact to rounding.
    n, c, k = 5000, 7, 2500
    with pytest.raises(OverflowError):
        float(math.comb(n, k))  # what a float binomial formula would need
    exact = _comb_pass_at_k(n, c, k)  # Python ints: exact, slow
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9)
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4, rel=1e-12)


def test_pass_at_k_is_undefined_with_fewer_than_k_scored_samples():
    assert pass_at_k(3, 1, 4) is None
    assert pass_at_k(0, 0, 1) is None
    assert pass_at_k(3, 3, 3) == 1.0  # n == k is defined


@pytest.mark.parametrize("n,c,k,what", [(3, 1, 0, "k=0"), (3, 1, True, "k=True"), (3, 4, 1, "c=4"),
                                        (-1, 0, 1, "n=-1"), (3, 1, 1.5, "k=1.5")])
def test_pass_at_k_bad_input_names_the_value(n, c, k, what):
    with pytest.raises(ConfigError, match=what.split("=")[0]):
        pass_at_k(n, c, k)


def test_bootstrap_is_seeded_and_sane():
    values = [1.0] * 50 + [0.0] * 50
    a = bootstrap_interval(values, seed=7, stream=1)
    b = bootstrap_interval(values, seed=7, stream=1)
    assert a == b
    cont = np.random.default_rng(0).random(40).tolist()
    assert bootstrap_interval(cont, seed=7, stream=1) == bootstrap_interval(cont, seed=7, stream=1)
    assert bootstrap_interval(cont, seed=7, stream=1) != bootstrap_interval(cont, seed=8, stream=1)
    assert bootstrap_interval(cont, seed=7, stream=1) != bootstrap_interval(cont, seed=7, stream=2)
    assert a.value == 0.5 and a.num_tasks == 100
    # the standard error of a mean of 100 fair coins is 0.05: the 95 % interval is about 0.5 ± 0.098
    assert a.low == pytest.approx(0.40, abs=0.02) and a.high == pytest.approx(0.60, abs=0.02)
    assert bootstrap_interval([0.25] * 9, seed=0, stream=0) == bootstrap_interval([0.25] * 9, seed=0, stream=0)
    const = bootstrap_interval([0.25] * 9, seed=0, stream=0)
    assert const.low == const.high == const.value == 0.25
    empty = bootstrap_interval([], seed=0, stream=0)
    assert empty.value is None and empty.low is None and empty.num_tasks == 0
    with pytest.raises(ConfigError, match="confidence"):
        bootstrap_interval(values, seed=0, stream=0, confidence=95)
    with pytest.raises(ConfigError, match="num_resamples"):
        bootstrap_interval(values, seed=0, stream=0, num_resamples=0)


def _ep(task: str, reward: float | None, *, tokens: int = 3, success: bool | None = None,
        reason: TerminationReason = TerminationReason.ENV_TERMINATED) -> Episode:
    turn = Turn(prompt_ids=[1], completion_ids=list(range(2, 2 + tokens)), behavior_log_probs=[-0.1] * tokens,
                reward=reward)
    return Episode(group_id=f"{task}@0", env_id="agentrl/Test-v0", task_id=task, seed=0, turns=[turn],
                   terminated=True, termination_reason=reason, success=success)


def test_errored_samples_leave_n_and_are_never_failures():
    eps = [_ep("a", 1.0), _ep("a", 0.0), _ep("a", None, reason=TerminationReason.INFRA_ERROR),
           _ep("a", 0.0, reason=TerminationReason.REWARD_ERROR),
           _ep("b", 0.0), _ep("b", 0.0), _ep("b", 0.3, success=True),
           _ep("c", 0.0, reason=TerminationReason.ABORTED), _ep("c", None)]  # c: nothing scored
    out = {o.task_id: o for o in task_outcomes(eps)}
    assert (out["a"].n, out["a"].c, out["a"].errored) == (2, 1, 2)
    assert (out["b"].n, out["b"].c, out["b"].errored) == (3, 1, 0)  # success=True beats reward < 1
    assert (out["c"].n, out["c"].errored) == (0, 2)  # a missing reward is unscored, not a 0
    assert out["a"].tokens_generated == 12  # errored samples' tokens are paid work

    rep = summarize(list(out.values()), ks=[1, 2, 3], seed=3)
    # pass@1: mean over a (1/2) and b (1/3); c has no scored sample and is undefined
    assert rep.pass_at[1].value == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert rep.pass_at[1].num_tasks == 2
    assert rep.pass_at[2].value == pytest.approx((1.0 + (1 - 1 / 3)) / 2)
    assert rep.pass_at[3].num_tasks == 1 and rep.pass_at[3].value == pytest.approx(1.0)  # only b has 3
    assert rep.reward_mean.value == pytest.approx((0.5 + 0.1) / 2)
    assert (rep.samples_scored, rep.samples_errored, rep.num_tasks) == (5, 4, 3)
    assert rep.tokens_generated == 27 and rep.tokens_per_sample == pytest.approx(3.0)
    m = rep.metrics()
    assert m["eval/pass@1"] == pytest.approx(rep.pass_at[1].value) and m["eval/samples_errored"] == 4.0
    assert rep.pass_at[1].low <= rep.pass_at[1].value <= rep.pass_at[1].high


def test_summarize_is_deterministic_per_seed_and_per_k():
    rng = np.random.default_rng(0)
    eps = [_ep(f"t{t}", float(rng.random() < 0.3)) for t in range(20) for _ in range(4)]
    outs = task_outcomes(eps)
    a = summarize(outs, ks=[1, 2, 4], seed=11)
    b = summarize(outs, ks=[1, 2, 4], seed=11)
    assert a.metrics() == b.metrics()
    # asking for fewer k's does not move pass@1's interval (one bootstrap stream per statistic)
    assert summarize(outs, ks=[1], seed=11).pass_at[1] == a.pass_at[1]
    assert summarize(outs, ks=[5], seed=11).pass_at[5].value is None  # 4 samples per task < 5
    with pytest.raises(ConfigError, match="k=0"):
        summarize(outs, ks=[0], seed=11)
