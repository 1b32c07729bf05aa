"""The symptom table of RL training faults as checks over one run's own data.

Each check returns a ``Finding``: whether it fires (or was skipped, with the reason, when the
run's data cannot answer it yet), the numbers behind it, the thresholds it used (the module
constants below, each with why) and example episode ids (the viewer opens them at
``/episode?id=...``). The per-task and per-group checks read training episodes only
(``training_episodes``). Symptom rows and the checks that tell their causes apart:

- reward flat → ``reward_flat`` (zero-variance group fraction, per-task success slices),
  ``constant_judge`` (the same score for different answers), ``wrong_reference`` (samples
  agree and the judge says wrong; see ``agentrl.replay.diagnose.tasks``)
- reward up but eval flat → ``train_up_eval_flat`` (``eval/*`` metrics)
- answers converging → ``answers_converging`` (within-group agreement rising, entropy falling)
- responses growing → ``length_growth`` (truncation / EOS / tool-loop rates by length bucket),
  ``reward_pays_length`` (reward rank-correlated with response length within a task)
- loss or ratio spikes → ``update_spikes`` (loss, ratio, KL, grad norm, engine↔trainer gap;
  the iteration whose batch caused it)
- async faster but worse → ``stale_async`` (reward, success and engine↔trainer gap by
  policy-lag bucket; ``async/*`` metrics)
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.replay.diagnose.data import EpisodeFacts, RunData
from agentrl.replay.diagnose.tasks import AGREE_FRAC, HARD_MAX_SUCCESS, MIN_TASK_SAMPLES, classify_tasks

MAX_EXAMPLES = 5
"""Example episodes per finding: enough to open and compare, few enough to read."""
ZERO_VARIANCE_FRAC = 0.5
"""Fires above this share of groups whose rewards are all equal: GRPO gives such groups zero
advantage, so over half the batch teaches nothing (the default run once had 16 of 16)."""
MIN_JUDGE_EPISODES = 8
"""Fewest scored samples of a task before its judge is called constant."""
MIN_DISTINCT_ANSWERS = 4
"""Fewest distinct normalised answers that got the one score: a judge that pays the same for
four different answers is not reading them. A constant 0 is not called a constant judge:
all-fail tasks give it too (``reward_flat`` reports it; feed the judge a known-good answer).
Full marks for every sample is (the reward-hacking case: a judge that always passes) when
the samples' final answers differ: an easy task's passing samples agree on its one answer.
A task whose samples all pass while agreeing is easy, not flagged. (Where passing answers
legitimately differ, e.g. code, open the examples before blaming the judge.)"""
MAX_FINAL_ANSWER_CHARS = 64
"""Longest last action (characters, stripped) that counts as a final answer for the full-marks case: different
short answers (a number, a word, a phrase) cannot all be right, but different programs or
explanations that all pass can (HumanEval's easy tasks do), so full marks over long answers is
not called a constant judge. A constant score below full marks is flagged whatever the length."""
TRAIN_RISE = 0.1
"""Train reward rise (last minus first iteration, reward units) that counts as rising."""
EVAL_FLAT = 0.02
"""Eval change (last minus first eval point, the metric's units) at or below which eval is flat."""
AGREE_RISE = 0.25
"""Rise of mean within-group answer agreement (modal share, 0..1) from the first to the last
iteration that counts as converging: sampling noise moves it by a few hundredths."""
ENTROPY_DROP = 0.3
"""Relative fall of the mean token entropy (first to last iteration) that counts as falling."""
LENGTH_RISE = 0.25
"""Relative rise of the mean response length (tokens, first to last iteration) that counts as growing."""
LENGTH_CORR = 0.7
"""Spearman rank correlation of reward with response length (tokens or characters) within a
task above which the reward pays for length: a real judge of correctness correlates weakly."""
MIN_CORR_SAMPLES = 8
"""Fewest scored samples of a task (with at least 3 distinct lengths and 2 distinct rewards)
before its correlation is computed."""
SPIKE_MADS = 6.0
"""A metric value more than this many median absolute deviations from the run's median,
either way (a loss can spike negative), is a spike (robust to the spike itself, unlike a
standard deviation)."""
SPIKE_REL_FLOOR = 0.01
"""The MAD is at least this fraction of the median |value|: a metric flat except for float
noise (``actor/ratio_mean`` 1.0 with one 1.0000001) has a MAD of 0, and any wobble would
score as infinitely many MADs."""
SPIKE_ABS_TOL = {"actor/pg_loss": 1e-3, "actor/ratio_mean": 1e-3, "actor/ppo_kl": 1e-4, "actor/kl_loss": 1e-4,
                 "actor/grad_norm": 1e-3, "rollout_corr/gap_abs_mean": 1e-3, "rollout_corr/gap_abs_max": 1e-2}
"""...and at least this absolute amount per metric (its units; ``actor/ratio_mean`` as the
distance from 1): a metric at 0 (``pg_loss`` of zero-variance groups) with one 1e-6 is
noise, not a spike."""
MIN_SPIKE_ITERATIONS = 4
"""Fewest iterations of a metric before a spike can be told from the trend."""
SPIKE_KEYS = ("actor/pg_loss", "actor/ratio_mean", "actor/ppo_kl", "actor/kl_loss", "actor/grad_norm",
              "rollout_corr/gap_abs_mean", "rollout_corr/gap_abs_max")
"""Metrics checked for spikes (``actor/ratio_mean`` as its distance from 1)."""
MIN_BUCKET = 4
"""Fewest trained episodes in a policy-lag bucket before it is compared."""
STALE_GAP_RATIO = 2.0
"""Stale buckets' mean |trainer - behavior| log-prob gap over the fresh bucket's above which
staleness is what moves the data off-policy (on-policy, the gap is numerics only)."""
STALE_GAP_MIN = 0.01
"""...and at least this many nats, so that two numerics-sized gaps never fire."""
STALE_SUCCESS_DROP = 0.2
"""Success-rate drop from the fresh bucket to the stale ones that counts as worse."""


@dataclass
class Finding:
    """One check's result. ``check``: its name; ``symptom``: the table row; ``fired``;
    ``summary``: one line; ``numbers``: what it measured; ``thresholds``: what it compared
    with; ``examples``: episode ids; ``tasks``: task ids it names (where it is per task);
    ``skipped``: why the check could not run on this run's data (e.g. "needs 2+
    iterations"), ``None`` when it ran. A skipped check never fires: its silence says
    nothing about the symptom."""

    check: str
    symptom: str
    fired: bool
    summary: str
    numbers: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def status(self) -> str:
        """``"fires"``, ``"no"`` (ran, did not fire) or ``"skipped"`` (could not run)."""
        return "fires" if self.fired else "skipped" if self.skipped is not None else "no"

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "symptom": self.symptom, "fired": self.fired, "status": self.status,
                "skipped": self.skipped, "summary": self.summary, "numbers": self.numbers,
                "thresholds": self.thresholds, "examples": self.examples, "tasks": self.tasks}


def _skipped(check: str, symptom: str, reason: str, numbers: dict[str, Any], thresholds: dict[str, float]) -> Finding:
    """The finding of a check that could not run; ``reason`` is also its summary."""
    return Finding(check, symptom, False, reason, numbers, thresholds, skipped=reason)


def _groups(eps: Sequence[EpisodeFacts]) -> dict[str, list[EpisodeFacts]]:
    out: dict[str, list[EpisodeFacts]] = defaultdict(list)
    for e in eps:
        if e.scored:
            out[f"{e.iteration}/{e.group_id}"].append(e)
    return out


def training_episodes(data: RunData) -> list[EpisodeFacts]:
    """The run's training episodes (kind ``train``), which the per-task and per-group checks
    and the task classes count: eval and difficulty-profile episodes are sampled with other
    settings (eval at its own temperature) and would blur them. A run without training
    episodes (an eval run) gives all of its episodes."""
    train = [e for e in data.episodes if e.kind == "train"]
    return train or list(data.episodes)


def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman rank correlation (ties get mean ranks); ``None`` when either side is constant."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5


def check_reward_flat(data: RunData) -> Finding:
    groups = _groups(training_episodes(data))
    flat = {g: eps for g, eps in groups.items() if len(eps) > 1 and len({e.reward for e in eps}) == 1}
    sized = [g for g, eps in groups.items() if len(eps) > 1]
    frac = len(flat) / len(sized) if sized else 0.0
    kinds = Counter({"all_fail": 0, "all_pass": 0, "constant": 0})
    kinds.update("all_pass" if all(e.success for e in eps) else "all_fail" if eps[0].reward == 0 else "constant"
                 for eps in flat.values())
    slices = {}
    for t in classify_tasks(training_episodes(data)):
        slices[t.task_id] = {"samples": t.samples, "success_rate": round(t.success_rate, 4), "class": t.verdict}
    numbers = {"zero_variance_group_frac": round(frac, 4), "groups": len(sized), "zero_variance_groups": len(flat),
               **{f"zero_variance_{k}": v for k, v in kinds.items()}, "tasks": slices}
    th = {"zero_variance_frac": ZERO_VARIANCE_FRAC}
    if len(sized) < 2:
        return _skipped("reward_flat", "reward flat",
                        f"needs 2+ groups of 2+ scored training samples ({len(sized)} here)", numbers, th)
    fired = frac > ZERO_VARIANCE_FRAC
    examples = [eps[0].episode_id for eps in list(flat.values())[:MAX_EXAMPLES]]
    return Finding("reward_flat", "reward flat", fired,
                   f"{len(flat)} of {len(sized)} groups have zero reward variance ({frac:.0%}): "
                   f"{kinds['all_fail']} all fail, {kinds['all_pass']} all pass, {kinds['constant']} other",
                   numbers, th, examples)


def check_constant_judge(data: RunData) -> Finding:
    by_task: dict[tuple[str, str], list[EpisodeFacts]] = defaultdict(list)
    for e in training_episodes(data):
        if e.scored:
            by_task[(e.env_id, e.task_id)].append(e)
    hits, numbers = [], {}
    for (env, task), eps in sorted(by_task.items()):
        rewards = {e.reward for e in eps}
        answers = {e.answer for e in eps}
        if len(rewards) != 1:
            continue
        (value,) = rewards
        numbers[task] = {"env_id": env, "episodes": len(eps), "reward": value, "distinct_answers": len(answers)}
        full = all(e.success for e in eps)
        numbers[task]["all_success"] = full
        # a constant non-zero score for 4+ different answers; full marks too (an easy task's
        # passing answers agree, so under MIN_DISTINCT_ANSWERS distinct ones it is not flagged)
        short = all(e.last_action_chars <= MAX_FINAL_ANSWER_CHARS for e in eps)
        if (len(eps) >= MIN_JUDGE_EPISODES and len(answers) >= MIN_DISTINCT_ANSWERS and value != 0
                and (not full or short)):
            hits.append((task, eps))
    th = {"min_judge_episodes": MIN_JUDGE_EPISODES, "min_distinct_answers": MIN_DISTINCT_ANSWERS,
          "max_final_answer_chars": MAX_FINAL_ANSWER_CHARS}
    if not any(len(eps) >= MIN_JUDGE_EPISODES for eps in by_task.values()):
        return _skipped("constant_judge", "reward flat",
                        f"needs a task with {MIN_JUDGE_EPISODES}+ scored training samples", {"constant_tasks": numbers}, th)
    fired = bool(hits)
    summary = ("; ".join(f"{task}: all {len(eps)} samples scored {eps[0].reward:g} across "
                         f"{numbers[task]['distinct_answers']} different answers"
                         + (" (full marks for all: reward hacking?)" if numbers[task]["all_success"] else "")
                         for task, eps in hits)
               if fired else "no task gives one score to different answers")
    examples = [eps[i].episode_id for i in range(MAX_EXAMPLES) for _, eps in hits if i < len(eps)][:MAX_EXAMPLES]
    return Finding("constant_judge", "reward flat", fired, summary, {"constant_tasks": numbers}, th,
                   examples, [t for t, _ in hits])


def check_wrong_reference(data: RunData) -> Finding:
    verdicts = classify_tasks(training_episodes(data))
    wrong = [t for t in verdicts if t.verdict == "wrong_reference"]
    hard = [t for t in verdicts if t.verdict == "hard"]
    numbers = {"likely_wrong_reference": {t.task_id: {"samples": t.samples, "agreed_answer": t.agreed_answer,
                                                      "agree_frac": round(t.agree_frac, 4)} for t in wrong},
               "hard": {t.task_id: {"samples": t.samples, "successes": t.successes} for t in hard},
               "unsolved": [t.task_id for t in verdicts if t.verdict == "unsolved"],
               "classes": dict(Counter(t.verdict for t in verdicts))}
    summary = (f"{len(wrong)} task(s) where the samples agree and the judge says wrong (likely wrong reference): "
               + ", ".join(f"{t.task_id} ({t.agree_frac:.0%} answer {t.agreed_answer!r})" for t in wrong)
               if wrong else "no task whose samples agree on an answer the judge rejects")
    if hard:
        summary += f"; hard (rare successes): {', '.join(t.task_id for t in hard)}"
    th = {"agree_frac": AGREE_FRAC, "min_task_samples": MIN_TASK_SAMPLES, "hard_max_success": HARD_MAX_SUCCESS}
    if all(t.verdict == "too_few" for t in verdicts):
        return _skipped("wrong_reference", "reward flat",
                        f"needs a task with {MIN_TASK_SAMPLES}+ scored training samples", numbers, th)
    return Finding("wrong_reference", "reward flat", bool(wrong), summary, numbers, th,
                   [t.episode_ids[0] for t in wrong][:MAX_EXAMPLES], [t.task_id for t in wrong])


def _first_last(series: list[tuple[int, float]]) -> tuple[float, float] | None:
    return (series[0][1], series[-1][1]) if len(series) >= 2 else None


def check_train_up_eval_flat(data: RunData) -> Finding:
    train = _first_last(data.series("rollout/reward_mean"))
    key = next((k for k in ("eval/pass@1", "eval/reward_mean") if data.series(k)), None)
    ev = _first_last(data.series(key)) if key else None
    numbers: dict[str, Any] = {"eval_metric": key}
    if train:
        numbers.update(train_first=train[0], train_last=train[1])
    if ev:
        numbers.update(eval_first=ev[0], eval_last=ev[1])
    if not train or not ev:
        return _skipped("train_up_eval_flat", "reward up but eval flat",
                        "needs 2+ iterations of rollout/reward_mean and 2+ eval points (eval.every)",
                        numbers, {"train_rise": TRAIN_RISE, "eval_flat": EVAL_FLAT})
    fired = train[1] - train[0] >= TRAIN_RISE and ev[1] - ev[0] <= EVAL_FLAT
    return Finding("train_up_eval_flat", "reward up but eval flat", fired,
                   f"train reward {train[0]:.3f} -> {train[1]:.3f}, {key} {ev[0]:.3f} -> {ev[1]:.3f}",
                   numbers, {"train_rise": TRAIN_RISE, "eval_flat": EVAL_FLAT})


def _agreement(eps: Sequence[EpisodeFacts]) -> float | None:
    shares = [Counter(e.answer for e in g).most_common(1)[0][1] / len(g)
              for g in _groups(eps).values() if len(g) > 1]
    return statistics.fmean(shares) if shares else None


def check_answers_converging(data: RunData) -> Finding:
    eps = training_episodes(data)
    its = sorted({e.iteration for e in eps})
    per_it = {it: _agreement([e for e in eps if e.iteration == it]) for it in its}
    per_it = {it: a for it, a in per_it.items() if a is not None}
    ent = data.series("actor/entropy")
    numbers: dict[str, Any] = {"agreement_by_iteration": {str(k): round(v, 4) for k, v in per_it.items()},
                               "entropy_by_iteration": {str(k): v for k, v in ent}}
    th = {"agree_rise": AGREE_RISE, "entropy_drop": ENTROPY_DROP}
    if len(per_it) < 2:
        return _skipped("answers_converging", "answers converging",
                        "needs 2+ iterations with groups of 2+ scored samples", numbers, th)
    first, last = per_it[min(per_it)], per_it[max(per_it)]
    e0e1 = _first_last(ent)
    falling = e0e1 is None or (e0e1[0] > 0 and (e0e1[0] - e0e1[1]) / e0e1[0] >= ENTROPY_DROP)
    fired = last - first >= AGREE_RISE and falling
    last_it = max(per_it)
    examples = [g[0].episode_id for g in _groups([e for e in eps if e.iteration == last_it]).values()
                if len({e.answer for e in g}) == 1][:MAX_EXAMPLES] if fired else []
    ent_txt = f", entropy {e0e1[0]:.3f} -> {e0e1[1]:.3f}" if e0e1 else ", no entropy metric"
    return Finding("answers_converging", "answers converging", fired,
                   f"within-group answer agreement {first:.2f} -> {last:.2f}{ent_txt}", numbers, th, examples)


def _rate(eps: Sequence[EpisodeFacts], pred: Callable[[EpisodeFacts], bool]) -> float:
    return sum(1 for e in eps if pred(e)) / len(eps) if eps else 0.0


def check_length_growth(data: RunData) -> Finding:
    eps = [e for e in training_episodes(data) if e.termination is None or not e.termination.is_error]
    by_it: dict[int, list[int]] = defaultdict(list)
    for e in eps:
        by_it[e.iteration].append(e.response_tokens)
    means = {it: statistics.fmean(v) for it, v in sorted(by_it.items())}
    lengths = sorted(e.response_tokens for e in eps)
    buckets: dict[str, dict[str, float]] = {}
    if lengths:
        edges = sorted({lengths[int(q * (len(lengths) - 1))] for q in (0.25, 0.5, 0.75)})
        lo = 0
        for hi in [*edges, None]:
            b = [e for e in eps if e.response_tokens >= lo and (hi is None or e.response_tokens < hi)]
            if b:
                buckets[f"{lo}-{'' if hi is None else hi - 1}"] = {
                    "episodes": len(b), "truncation_rate": round(_rate(b, lambda e: e.truncated_by_length), 4),
                    "eos_rate": round(_rate(b, lambda e: bool(e.finish_reasons) and e.finish_reasons[-1] == "stop"), 4),
                    "tool_loop_rate": round(_rate(b, lambda e: e.termination is not None
                                                  and e.termination.value == "max_turns" and e.tool_calls > 0), 4)}
            lo = hi if hi is not None else lo
    numbers: dict[str, Any] = {"mean_tokens_by_iteration": {str(k): round(v, 2) for k, v in means.items()},
                               "buckets": buckets}
    th = {"length_rise": LENGTH_RISE}
    if len(means) < 2:
        return _skipped("length_growth", "responses growing", "needs 2+ iterations", numbers, th)
    first, last = means[min(means)], means[max(means)]
    rise = (last - first) / first if first > 0 else 0.0
    numbers["rise"] = round(rise, 4)
    fired = rise >= LENGTH_RISE
    longest = sorted(eps, key=lambda e: -e.response_tokens)[:MAX_EXAMPLES] if fired else []
    return Finding("length_growth", "responses growing", fired,
                   f"mean response {first:.1f} -> {last:.1f} tokens ({rise:+.0%})", numbers, th,
                   [e.episode_id for e in longest])


def check_reward_pays_length(data: RunData) -> Finding:
    by_task: dict[str, list[EpisodeFacts]] = defaultdict(list)
    for e in training_episodes(data):
        if e.scored:
            by_task[e.task_id].append(e)
    corrs, hits = {}, []
    for task, eps in sorted(by_task.items()):
        if len(eps) < MIN_CORR_SAMPLES or len({e.reward for e in eps}) < 2:
            continue
        rewards = [float(e.reward) for e in eps]  # type: ignore[arg-type]
        best = None
        for name, get in (("tokens", lambda e: e.response_tokens), ("chars", lambda e: e.response_chars)):
            xs = [float(get(e)) for e in eps]
            if len(set(xs)) >= 3:
                rho = spearman(xs, rewards)
                if rho is not None and (best is None or rho > best[1]):
                    best = (name, rho)
        if best:
            corrs[task] = {"by": best[0], "spearman": round(best[1], 4), "samples": len(eps)}
            if best[1] >= LENGTH_CORR:
                hits.append((task, eps))
    th = {"length_corr": LENGTH_CORR, "min_corr_samples": MIN_CORR_SAMPLES}
    if not corrs:
        return _skipped("reward_pays_length", "responses growing",
                        f"needs a task with {MIN_CORR_SAMPLES}+ scored training samples of 2+ rewards and 3+ lengths",
                        {"tasks": corrs}, th)
    examples = [max(eps, key=lambda e: e.reward).episode_id for _, eps in hits][:MAX_EXAMPLES]
    summary = (", ".join(f"{t}: reward~length spearman {corrs[t]['spearman']:.2f} ({corrs[t]['by']})" for t, _ in hits)
               if hits else "no task's reward follows response length")
    return Finding("reward_pays_length", "responses growing", bool(hits), summary, {"tasks": corrs}, th, examples,
                   [t for t, _ in hits])


def check_update_spikes(data: RunData) -> Finding:
    spikes, numbers = [], {}
    for key in SPIKE_KEYS:
        s = data.series(key)
        if len(s) < MIN_SPIKE_ITERATIONS:
            continue
        vals = [abs(v - 1.0) if key == "actor/ratio_mean" else v for _, v in s]
        med = statistics.median(vals)
        mad = max(statistics.median(abs(v - med) for v in vals), SPIKE_REL_FLOOR * abs(med), SPIKE_ABS_TOL[key])
        worst = max(range(len(vals)), key=lambda i: abs(vals[i] - med))
        score = abs(vals[worst] - med) / mad
        numbers[key] = {"median": med, "mad": mad, "worst_iteration": s[worst][0], "worst": s[worst][1],
                        "mads": round(score, 2)}
        if score > SPIKE_MADS:
            spikes.append((key, s[worst][0]))
    if not numbers:
        return _skipped("update_spikes", "loss or ratio spikes",
                        f"needs {MIN_SPIKE_ITERATIONS}+ iterations of the update metrics", numbers,
                        {"spike_mads": SPIKE_MADS, "min_iterations": MIN_SPIKE_ITERATIONS, "spike_rel_floor": SPIKE_REL_FLOOR})
    # the batch that caused it: that iteration's trained episodes, largest engine-trainer gap first
    examples: list[str] = []
    for _, it in spikes:
        batch = [e for e in data.episodes if e.iteration == it and e.trained]
        batch.sort(key=lambda e: -(e.gap_abs_mean or 0.0))
        examples += [e.episode_id for e in batch[:2]]
    summary = ("; ".join(f"{k} spikes at iteration {it} (batch of iteration {it})" for k, it in spikes)
               if spikes else "no update metric spikes")
    return Finding("update_spikes", "loss or ratio spikes", bool(spikes), summary, numbers,
                   {"spike_mads": SPIKE_MADS, "min_iterations": MIN_SPIKE_ITERATIONS, "spike_rel_floor": SPIKE_REL_FLOOR}, examples[:MAX_EXAMPLES])


def _bucket(lag: int) -> str:
    return str(lag) if lag < 3 else "3+"


def check_stale_async(data: RunData) -> Finding:
    eps = [e for e in data.episodes if e.trained and e.lag is not None and e.scored]
    by: dict[str, list[EpisodeFacts]] = defaultdict(list)
    for e in eps:
        by[_bucket(e.lag)].append(e)  # type: ignore[arg-type]
    buckets = {}
    for b, bes in sorted(by.items()):
        gaps = [e.gap_abs_mean for e in bes if e.gap_abs_mean is not None]
        buckets[b] = {"episodes": len(bes), "reward_mean": round(statistics.fmean(e.reward for e in bes), 4),  # type: ignore[misc]
                      "success_rate": round(_rate(bes, lambda e: bool(e.success)), 4),
                      "gap_abs_mean": statistics.fmean(gaps) if gaps else None}
    stale_max = max((v for _, v in data.series("async/staleness_max")), default=None)
    numbers: dict[str, Any] = {"buckets": buckets, "async_staleness_max": stale_max,
                               "async_stale_dropped": sum(v for _, v in data.series("async/stale_dropped"))}
    th = {"min_bucket": MIN_BUCKET, "stale_gap_ratio": STALE_GAP_RATIO, "stale_gap_min": STALE_GAP_MIN,
          "stale_success_drop": STALE_SUCCESS_DROP}
    fresh = buckets.get("0")
    stale = [e for b, bes in by.items() if b != "0" for e in bes]
    if not fresh or fresh["episodes"] < MIN_BUCKET or len(stale) < MIN_BUCKET:
        return _skipped("stale_async", "async faster but worse",
                        f"needs {MIN_BUCKET}+ trained episodes at lag 0 and at lag 1+ "
                        f"({fresh['episodes'] if fresh else 0} fresh, {len(stale)} stale)", numbers, th)
    reasons = []
    sgaps = [e.gap_abs_mean for e in stale if e.gap_abs_mean is not None]
    if fresh["gap_abs_mean"] is not None and sgaps:
        sg = statistics.fmean(sgaps)
        numbers["stale_gap_abs_mean"] = sg
        if sg >= STALE_GAP_MIN and sg >= STALE_GAP_RATIO * fresh["gap_abs_mean"]:
            reasons.append(f"engine-trainer log-prob gap {fresh['gap_abs_mean']:.4f} at lag 0, {sg:.4f} at lag 1+")
    s_succ = _rate(stale, lambda e: bool(e.success))
    if fresh["success_rate"] - s_succ >= STALE_SUCCESS_DROP:
        reasons.append(f"success {fresh['success_rate']:.2f} at lag 0, {s_succ:.2f} at lag 1+")
    examples = [e.episode_id for e in sorted(stale, key=lambda e: -(e.gap_abs_mean or 0.0))[:MAX_EXAMPLES]] if reasons else []
    return Finding("stale_async", "async faster but worse", bool(reasons),
                   "; ".join(reasons) if reasons else
                   f"stale samples ({len(stale)}) no worse than fresh ones ({fresh['episodes']})", numbers, th, examples)


CHECKS: tuple[Callable[[RunData], Finding], ...] = (
    check_reward_flat, check_constant_judge, check_wrong_reference, check_train_up_eval_flat,
    check_answers_converging, check_length_growth, check_reward_pays_length, check_update_spikes,
    check_stale_async)
"""Every check, in the symptom table's order."""

__all__ = ["CHECKS", "Finding", "spearman", "training_episodes"] + [c.__name__ for c in CHECKS]
