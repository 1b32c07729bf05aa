"""Held-out evaluation metrics: unbiased pass@k, mean reward and tokens, with bootstrap
confidence intervals over tasks.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", Sec. 2.1):
for a task with ``n`` scored samples of which ``c`` succeeded, the unbiased estimate of
"at least one of k samples drawn without replacement succeeds" is

    pass@k = 1 - C(n - c, k) / C(n, k)  =  1 - prod_{i = n-c+1}^{n} (1 - k / i)

computed as the product (the paper's numpy snippet), never with big binomials. It is
undefined when ``n < k``: ``pass_at_k`` returns None then.

Errored samples (``Episode.is_error``: infra_error, reward_error, aborted) are no evidence
about the policy: they are excluded from ``n`` (never counted as failures) and reported as
``samples_errored``. Their generated tokens still count in ``tokens_generated`` (paid work).

Aggregation over tasks: the benchmark's pass@k is the mean of the per-task values over the
tasks where it is defined (``n >= k``); ``Estimate.num_tasks`` says how many that is, so a
k that only some tasks reach is visible, and a k no task reaches is ``value=None``.

Confidence intervals: percentile bootstrap over tasks (tasks resampled with replacement,
``num_resamples`` times, the statistic recomputed on each resample; Efron & Tibshirani 1993,
ch. 13). The generator is ``numpy.random.default_rng([seed, stream])`` with one fixed stream
per statistic, so the same seed gives the same interval, and asking for other k's does not
move the interval of this one. With one task the interval is the point itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from agentrl.errors import ConfigError
from agentrl.types import Episode

__all__ = ["Estimate", "EvalReport", "TaskOutcome", "bootstrap_interval", "episode_success",
           "pass_at_k", "summarize", "task_outcomes"]


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Unbiased pass@k of one task (Chen et al. 2021, Sec. 2.1; module docstring).

    Args:
        n: scored samples of the task (errored ones excluded), ``n >= 0``.
        c: successful samples among them, ``0 <= c <= n``.
        k: ``k >= 1``.

    Returns:
        The estimate in [0, 1], or None when ``n < k`` (undefined: fewer than k samples scored).

    Raises:
        ConfigError: ``k < 1``, ``n < 0`` or ``c`` outside ``[0, n]``.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"k={k!r} must be an integer >= 1")
    if n < 0 or not 0 <= c <= n:
        raise ConfigError(f"pass@k needs 0 <= c <= n; got n={n!r}, c={c!r}")
    if n < k:
        return None
    if n - c < k:  # every k-subset holds a success
        return 1.0
    # 1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1..n} (1 - k/i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def episode_success(episode: Episode) -> bool:
    """Whether a scored episode solved its task: the env's ``success`` when it says, else
    ``total_reward >= 1`` (as ``Episode.success`` documents and ``rollout/success_rate`` counts).

    Raises:
        ConfigError: an errored episode (it has no score).
    """
    if episode.is_error:
        raise ConfigError(f"episode {episode.episode_id!r} ended with {episode.termination_reason}: it has no score")
    if episode.success is not None:
        return bool(episode.success)
    return (episode.total_reward or 0.0) >= 1.0


@dataclass(frozen=True)
class TaskOutcome:
    """One task's samples.

    Attributes:
        task_id: the task.
        successes: per scored sample, solved or not (len = n).
        rewards: per scored sample, its total reward (len = n; a scored sample with a
            missing reward counts as errored instead).
        errored: samples excluded from n (infra / reward errors, aborted).
        tokens_generated: sampled tokens of all its samples, errored ones included.
    """

    task_id: str
    successes: tuple[bool, ...]
    rewards: tuple[float, ...]
    errored: int = 0
    tokens_generated: int = 0

    @property
    def n(self) -> int:
        return len(self.successes)

    @property
    def c(self) -> int:
        return sum(self.successes)


def task_outcomes(episodes: Iterable[Episode]) -> list[TaskOutcome]:
    """Group episodes by ``task_id`` (in first-seen order) into ``TaskOutcome`` records.

    An episode that is not an error but has no total reward (a turn's reward missing) is
    counted as errored: it cannot be scored, and is not a failure.
    """
    acc: dict[str, dict] = {}
    for e in episodes:
        a = acc.setdefault(e.task_id, {"s": [], "r": [], "err": 0, "tok": 0})
        a["tok"] += e.num_generated_tokens()
        reward = None if e.is_error else e.total_reward
        if reward is None:
            a["err"] += 1
            continue
        a["s"].append(episode_success(e))
        a["r"].append(float(reward))
    return [TaskOutcome(t, tuple(a["s"]), tuple(a["r"]), a["err"], a["tok"]) for t, a in acc.items()]


@dataclass(frozen=True)
class Estimate:
    """A statistic over tasks with its bootstrap interval.

    Attributes:
        value: the point estimate (mean over ``num_tasks`` tasks), None when undefined.
        low, high: the interval's ends (None with ``value``).
        num_tasks: tasks it is computed over.
    """

    value: float | None
    low: float | None
    high: float | None
    num_tasks: int


def bootstrap_interval(values: Sequence[float], *, seed: int, stream: int, num_resamples: int = 1000,
                       confidence: float = 0.95) -> Estimate:
    """Mean of ``values`` (one per task) and its percentile-bootstrap interval over tasks.

    Args:
        values: per-task values, shape [T] float.
        seed, stream: the generator is ``numpy.random.default_rng([seed, stream])``.
        num_resamples: bootstrap resamples B (the interval needs B >= 1).
        confidence: interval mass in (0, 1), e.g. 0.95.

    Returns:
        ``Estimate``; ``value=None`` when ``values`` is empty.

    Raises:
        ConfigError: ``num_resamples < 1`` or ``confidence`` outside (0, 1).
    """
    if num_resamples < 1:
        raise ConfigError(f"num_resamples={num_resamples!r} must be >= 1")
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence={confidence!r} must be in (0, 1), e.g. 0.95")
    v = np.asarray(values, dtype=np.float64)  # (T,)
    if v.size == 0:
        return Estimate(None, None, None, 0)
    rng = np.random.default_rng([int(seed), int(stream)])
    idx = rng.integers(0, v.size, size=(num_resamples, v.size))  # (B, T)
    means = v[idx].mean(axis=1)  # (B,)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return Estimate(float(v.mean()), float(low), float(high), int(v.size))


@dataclass(frozen=True)
class EvalReport:
    """What an evaluation measured.

    Attributes:
        pass_at: k -> pass@k over the tasks where ``n >= k`` (module docstring).
        reward_mean: per-task mean reward of the scored samples, averaged over tasks that
            have any.
        tokens_generated: sampled tokens of every sample, errored ones included.
        tokens_per_sample: ``tokens_generated`` / samples rolled out.
        num_tasks, samples_scored, samples_errored: counts.
        seed, confidence, num_resamples: how the intervals were drawn.
    """

    pass_at: dict[int, Estimate]
    reward_mean: Estimate
    tokens_generated: int
    tokens_per_sample: float
    num_tasks: int
    samples_scored: int
    samples_errored: int
    seed: int
    confidence: float
    num_resamples: int
    per_task: list[TaskOutcome] = field(default_factory=list, repr=False)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """Flat metric names (``eval/pass@1``, ``eval/pass@1_low`` ...); undefined values are NaN."""
        nan = float("nan")
        m: dict[str, float] = {}
        for k, est in self.pass_at.items():
            m[f"{prefix}pass@{k}"] = nan if est.value is None else est.value
            m[f"{prefix}pass@{k}_low"] = nan if est.low is None else est.low
            m[f"{prefix}pass@{k}_high"] = nan if est.high is None else est.high
        r = self.reward_mean
        m[f"{prefix}reward_mean"] = nan if r.value is None else r.value
        m[f"{prefix}reward_mean_low"] = nan if r.low is None else r.low
        m[f"{prefix}reward_mean_high"] = nan if r.high is None else r.high
        m[f"{prefix}tokens_generated"] = float(self.tokens_generated)
        m[f"{prefix}tokens_per_sample"] = float(self.tokens_per_sample)
        m[f"{prefix}tasks"] = float(self.num_tasks)
        m[f"{prefix}samples_scored"] = float(self.samples_scored)
        m[f"{prefix}samples_errored"] = float(self.samples_errored)
        return m


_REWARD_STREAM = 0  # pass@k uses stream k (>= 1)


def summarize(outcomes: Sequence[TaskOutcome], ks: Sequence[int], *, seed: int, num_resamples: int = 1000,
              confidence: float = 0.95) -> EvalReport:
    """pass@k for each ``k`` in ``ks``, mean reward and tokens, with intervals (module docstring).

    Raises:
        ConfigError: an invalid k, ``num_resamples`` or ``confidence``.
    """
    for k in ks:
        pass_at_k(0, 0, k)  # validates k before any work
    pass_at: dict[int, Estimate] = {}
    for k in ks:
        per_task = [pass_at_k(o.n, o.c, k) for o in outcomes]
        defined = [p for p in per_task if p is not None]
        pass_at[int(k)] = bootstrap_interval(defined, seed=seed, stream=int(k), num_resamples=num_resamples,
                                             confidence=confidence)
    rewards = [float(np.mean(o.rewards)) for o in outcomes if o.rewards]
    reward = bootstrap_interval(rewards, seed=seed, stream=_REWARD_STREAM, num_resamples=num_resamples,
                                confidence=confidence)
    tokens = sum(o.tokens_generated for o in outcomes)
    samples = sum(o.n + o.errored for o in outcomes)
    return EvalReport(pass_at, reward, tokens, tokens / samples if samples else 0.0, len(outcomes),
                      sum(o.n for o in outcomes), sum(o.errored for o in outcomes), int(seed), float(confidence),
                      int(num_resamples), list(outcomes))
