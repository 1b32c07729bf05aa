"""Task difficulty profiles: each task's pass rate under one policy, which tasks a
difficulty filter skips, the profile's JSON file and its terminal table.

A profile is ``n`` samples per task rolled out by one policy version (``agentrl tasks
profile``, or the training run's own profiling: ``agentrl.commands.profile``). Per task it
keeps ``n`` (scored samples), ``c`` (successes, ``agentrl.eval.passk.episode_success``),
the errored samples (infrastructure or reward errors, aborted: excluded from ``n``, never
failures, as in evaluation) and the tokens generated (errored samples included: paid work).

Skip rule (``env.difficulty_filter: skip_solved_and_unsolved``): a task whose pass rate
``c / n`` is 0 (every scored sample failed) or 1 (every one succeeded) *and* whose scored
samples all got the same reward gives a GRPO group zero reward variance, so zero advantages
and no gradient, under the policy profiled (DAPO's dynamic sampling drops such groups after
paying for them, Yu et al. 2025, Sec. 3.2, as ``algorithm.dynamic_sampling`` does for groups
whose rewards are all equal; the profile decides before the rollout). A partial-credit reward
(HumanEval's pass fraction of tests) can differ between samples none of which succeeded:
such a task (``reward_varies``) is kept. A task without a scored sample (``n = 0``) has no
pass rate and is never skipped.

File (``write_profile`` / ``read_profile``): one JSON object, ``"format":
"agentrl.task_profile/1"``, the metadata (env, split, policy version, samples, seed, the
sampling and budget, where it came from) and ``"tasks"``: one record per task in profile
order with ``task_id``, ``n``, ``c``, ``errored``, ``pass_rate`` (null when ``n = 0``),
``tokens_generated``, ``reward_varies`` (false when absent). A JSON file beside the run (not only replay-store rows): one small file
per profile that a tool reads without a database, and the CLI's profile of a bare model has no
run to store it in.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rich.table import Table

from agentrl.errors import ConfigError, ContractError
from agentrl.eval.passk import TaskOutcome

__all__ = ["PROFILE_FORMAT", "TaskPassRate", "TaskProfile", "profile_from_outcomes", "profile_table", "read_profile",
           "write_profile"]

PROFILE_FORMAT = "agentrl.task_profile/1"


@dataclass(frozen=True)
class TaskPassRate:
    """One task's profile: ``n`` scored samples, ``c`` successes among them, ``errored``
    samples (left out of ``n``), ``tokens_generated`` (all samples), ``reward_varies``
    (the scored samples' rewards are not all equal: a group has reward variance)."""

    task_id: str
    n: int
    c: int
    errored: int = 0
    tokens_generated: int = 0
    reward_varies: bool = False

    @property
    def pass_rate(self) -> float | None:
        """``c / n`` in [0, 1]; None without a scored sample."""
        return self.c / self.n if self.n else None

    @property
    def verdict(self) -> str:
        """``unsolved`` (pass rate 0), ``solved`` (1), ``mixed`` (another rate, or rewards that
        differ: ``reward_varies``) or ``unknown`` (``n = 0``)."""
        p = self.pass_rate
        if p is None:
            return "unknown"
        if self.reward_varies:
            return "mixed"
        return "unsolved" if p == 0.0 else "solved" if p == 1.0 else "mixed"


@dataclass(frozen=True)
class TaskProfile:
    """Pass rates of ``tasks`` under ``policy_version`` (module docstring).

    Attributes:
        env_id, split: where the tasks come from.
        policy_version: the weights profiled (0: the untrained model).
        samples: samples rolled out per task; seed: env instances and sampling seeds.
        budget: the sampling and limits used (temperature, max_turns, max_new_tokens,
            max_context_tokens).
        tasks: one record per task, in profile order.
        source: what was profiled (a run id, checkpoint or model), for the reader.
        iteration: the training iteration it was made before, from 1 (None outside a run).
    """

    env_id: str
    split: str
    policy_version: int
    samples: int
    seed: int
    budget: dict[str, Any]
    tasks: list[TaskPassRate] = field(default_factory=list)
    source: str = ""
    iteration: int | None = None

    @property
    def tokens_generated(self) -> int:
        return sum(t.tokens_generated for t in self.tasks)

    def skip_task_ids(self) -> list[str]:
        """Tasks with pass rate 0 or 1 and equal rewards (module docstring), in profile order."""
        return [t.task_id for t in self.tasks if t.verdict in ("solved", "unsolved")]

    def counts(self) -> dict[str, int]:
        """Tasks per verdict (``unsolved``, ``solved``, ``mixed``, ``unknown``)."""
        out = {"unsolved": 0, "solved": 0, "mixed": 0, "unknown": 0}
        for t in self.tasks:
            out[t.verdict] += 1
        return out

    def metrics(self, prefix: str = "profile/") -> dict[str, float]:
        """``profile/tasks``, ``profile/unsolved_tasks`` / ``solved_tasks`` / ``mixed_tasks`` /
        ``unknown_tasks``, ``profile/pass_rate_mean`` (over tasks with one; NaN without),
        ``profile/samples_scored``, ``profile/samples_errored``, ``profile/policy_version``,
        and ``tokens/profile_generated``."""
        rates = [t.pass_rate for t in self.tasks if t.pass_rate is not None]
        m = {f"{prefix}tasks": float(len(self.tasks)),
             **{f"{prefix}{k}_tasks": float(v) for k, v in self.counts().items()},
             f"{prefix}pass_rate_mean": float(sum(rates) / len(rates)) if rates else math.nan,
             f"{prefix}samples_scored": float(sum(t.n for t in self.tasks)),
             f"{prefix}samples_errored": float(sum(t.errored for t in self.tasks)),
             f"{prefix}policy_version": float(self.policy_version),
             "tokens/profile_generated": float(self.tokens_generated)}
        return m

    def to_json(self) -> dict[str, Any]:
        d = {"format": PROFILE_FORMAT, **{k: v for k, v in asdict(self).items() if k != "tasks"},
             "tokens_generated": self.tokens_generated,
             "tasks": [{**asdict(t), "pass_rate": t.pass_rate} for t in self.tasks]}
        return d

    @classmethod
    def from_json(cls, data: Any, where: str = "profile") -> "TaskProfile":
        """Read ``to_json``'s object.

        Raises:
            ContractError: another format, or a record without its fields.
        """
        if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ContractError(f"{where}: format {got!r}; expected {PROFILE_FORMAT!r}")
        try:
            tasks = [TaskPassRate(str(t["task_id"]), int(t["n"]), int(t["c"]), int(t.get("errored", 0)),
                                  int(t.get("tokens_generated", 0)), bool(t.get("reward_varies", False)))
                     for t in data["tasks"]]
            return cls(str(data["env_id"]), str(data["split"]), int(data["policy_version"]), int(data["samples"]),
                       int(data["seed"]), dict(data["budget"]), tasks, str(data.get("source", "")),
                       None if data.get("iteration") is None else int(data["iteration"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ContractError(f"{where}: a field is missing or malformed ({type(exc).__name__}: {exc})") from None


def profile_from_outcomes(outcomes: Sequence[TaskOutcome], order: Sequence[str] | None = None,
                          **meta: Any) -> TaskProfile:
    """A ``TaskProfile`` from ``agentrl.eval.passk.task_outcomes`` (errored samples already
    left out of ``n``), its tasks in ``order`` (e.g. the split's listing; tasks not in it
    after, in outcome order) or in outcome order; ``meta``: the ``TaskProfile`` fields but
    ``tasks``."""
    tasks = [TaskPassRate(o.task_id, o.n, o.c, o.errored, o.tokens_generated, len(set(o.rewards)) > 1)
             for o in outcomes]
    if order is not None:
        rank = {t: i for i, t in enumerate(order)}
        tasks.sort(key=lambda t: rank.get(t.task_id, len(rank)))  # stable: unknown ones keep outcome order
    return TaskProfile(tasks=tasks, **meta)


def write_profile(path: str | Path, profile: TaskProfile) -> Path:
    """Write ``profile`` as JSON at ``path`` (folders made; an earlier file replaced whole:
    written beside it, then renamed). Returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    tmp.replace(p)
    return p


def read_profile(path: str | Path) -> TaskProfile:
    """The profile ``write_profile`` wrote.

    Raises:
        ConfigError: a missing or unreadable file.
        ContractError: a file that is not a task profile.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"task profile {str(p)!r} does not exist") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"task profile {str(p)!r} could not be read as JSON: {exc}") from None
    return TaskProfile.from_json(data, where=f"task profile {str(p)!r}")


def profile_table(profile: TaskProfile) -> Table:
    """Per task: pass rate, c/n, errored samples, tokens, and what the filter does with it."""
    b = profile.budget
    t = Table(title=f"task pass rates, policy version {profile.policy_version} ({profile.env_id}, split {profile.split})",
              caption=(f"{profile.samples} samples per task, seed {profile.seed}; temperature {b.get('temperature')}, "
                       f"max_turns {b.get('max_turns')}, max_new_tokens {b.get('max_new_tokens')}; "
                       f"{profile.tokens_generated} tokens generated; errored samples are left out of n; "
                       "skipped: pass rate 0 or 1 with equal rewards (no reward variance in a group)"))
    for name in ("task", "pass rate", "c / n", "errored", "tokens", "filter"):
        t.add_column(name, justify="left" if name in ("task", "filter") else "right")
    for r in profile.tasks:
        rate = "-" if r.pass_rate is None else f"{r.pass_rate:.2f}"
        action = {"unsolved": "skip (never solved)", "solved": "skip (always solved)", "mixed": "keep",
                  "unknown": "keep (no scored sample)"}[r.verdict]
        t.add_row(r.task_id, rate, f"{r.c} / {r.n}", str(r.errored), str(r.tokens_generated), action)
    return t
