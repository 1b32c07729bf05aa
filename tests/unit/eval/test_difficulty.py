"""Task difficulty profiles: pass rates per task with errored samples left out of n, the skip
rule (pass rate 0 or 1), the JSON file and the terminal table."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from agentrl.errors import ConfigError, ContractError
from agentrl.eval.difficulty import PROFILE_FORMAT, TaskProfile, profile_from_outcomes, profile_table, read_profile, write_profile
from agentrl.eval.passk import task_outcomes
from agentrl.types import Episode, TerminationReason, Turn

OK = TerminationReason.ENV_TERMINATED


def _ep(task: str, reward: float | None, *, tokens: int = 3, reason: TerminationReason = OK) -> Episode:
    turn = Turn(prompt_ids=[1], completion_ids=list(range(2, 2 + tokens)), behavior_log_probs=[-0.1] * tokens,
                reward=reward)
    return Episode(group_id=f"{task}@0", env_id="agentrl/Test-v0", task_id=task, seed=0, turns=[turn],
                   terminated=True, termination_reason=reason)


def _profile() -> TaskProfile:
    eps = [_ep("never", 0.0), _ep("never", 0.0), _ep("never", None, reason=TerminationReason.INFRA_ERROR),
           _ep("always", 1.0), _ep("always", 1.0, tokens=5),
           # one success and one infra fault: n = 1, c = 1 (the fault is no failure): always solved
           _ep("lucky", 1.0), _ep("lucky", None, tokens=4, reason=TerminationReason.INFRA_ERROR),
           _ep("mixed", 1.0), _ep("mixed", 0.0), _ep("mixed", 0.0),
           _ep("broken", None, reason=TerminationReason.REWARD_ERROR), _ep("broken", 0.0, reason=TerminationReason.ABORTED)]
    return profile_from_outcomes(task_outcomes(eps), ["mixed", "never", "always", "broken", "lucky"],
                                 env_id="agentrl/Test-v0", split="train", policy_version=2, samples=3, seed=7,
                                 budget={"temperature": 1.0, "max_turns": 1, "max_new_tokens": 8,
                                         "max_context_tokens": 64}, source="run-x", iteration=4)


def test_pass_rates_leave_errored_samples_out_and_skip_only_rates_0_and_1():
    p = _profile()
    assert [t.task_id for t in p.tasks] == ["mixed", "never", "always", "broken", "lucky"]  # the given order
    by = {t.task_id: t for t in p.tasks}
    assert (by["never"].n, by["never"].c, by["never"].errored, by["never"].pass_rate) == (2, 0, 1, 0.0)
    assert (by["lucky"].n, by["lucky"].c, by["lucky"].errored, by["lucky"].verdict) == (1, 1, 1, "solved")
    assert by["mixed"].pass_rate == pytest.approx(1 / 3) and by["mixed"].verdict == "mixed"
    assert by["broken"].pass_rate is None and by["broken"].verdict == "unknown"  # nothing scored: kept
    assert p.skip_task_ids() == ["never", "always", "lucky"]
    assert p.counts() == {"unsolved": 1, "solved": 2, "mixed": 1, "unknown": 1}
    assert p.tokens_generated == 10 * 3 + 5 + 4  # every sample's tokens, errored ones included


def test_metrics_count_tasks_samples_and_the_profile_tokens():
    m = _profile().metrics()
    assert m["tokens/profile_generated"] == 39.0 and m["profile/policy_version"] == 2.0
    assert (m["profile/tasks"], m["profile/unsolved_tasks"], m["profile/solved_tasks"], m["profile/mixed_tasks"],
            m["profile/unknown_tasks"]) == (5.0, 1.0, 2.0, 1.0, 1.0)
    assert m["profile/samples_scored"] == 8.0 and m["profile/samples_errored"] == 4.0
    assert m["profile/pass_rate_mean"] == pytest.approx((1 / 3 + 0 + 1 + 1) / 4)
    empty = profile_from_outcomes([], env_id="e", split="train", policy_version=0, samples=2, seed=0, budget={})
    assert math.isnan(empty.metrics()["profile/pass_rate_mean"]) and empty.skip_task_ids() == []


def test_the_file_round_trips_and_a_bad_file_is_a_clear_error(tmp_path):
    p = _profile()
    path = write_profile(tmp_path / "profiles" / "iter_4.json", p)
    data = json.loads(path.read_text())
    assert data["format"] == PROFILE_FORMAT and data["tokens_generated"] == 39
    assert data["tasks"][1] == {"task_id": "never", "n": 2, "c": 0, "errored": 1, "tokens_generated": 9,
                                "reward_varies": False, "pass_rate": 0.0}
    assert data["tasks"][3]["pass_rate"] is None
    assert read_profile(path) == p
    with pytest.raises(ConfigError, match="does not exist"):
        read_profile(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="could not be read as JSON"):
        read_profile(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "something/9"}))
    with pytest.raises(ContractError, match=r"'something/9'.*expected 'agentrl.task_profile/1'"):
        read_profile(tmp_path / "other.json")
    (tmp_path / "short.json").write_text(json.dumps({"format": PROFILE_FORMAT, "tasks": []}))
    with pytest.raises(ContractError, match="missing or malformed"):
        read_profile(tmp_path / "short.json")


def test_the_table_shows_each_task_and_what_the_filter_does():
    console = Console(width=200, record=True)
    console.print(profile_table(_profile()))
    text = console.export_text()
    for needle in ("policy version 2", "never", "0.00", "skip (never solved)", "always", "skip (always solved)",
                   "mixed", "0.33", "keep", "broken", "keep (no scored sample)", "1 / 3", "39 tokens generated"):
        assert needle in text, needle


def test_a_task_with_partial_rewards_that_differ_is_kept_though_no_sample_succeeded():
    """The skip rule is about reward variance (a GRPO group with equal rewards has zero
    advantages), as the run's own dynamic sampling drops groups whose rewards are all equal:
    HumanEval's reward is a pass fraction of tests, so samples at 0.0 and 0.6 give a gradient
    although neither succeeded (pass rate 0). Equal partial rewards are still skipped."""
    eps = [_ep("partial", 0.0), _ep("partial", 0.6), _ep("flat", 0.5), _ep("flat", 0.5), _ep("never", 0.0),
           _ep("never", 0.0)]
    p = profile_from_outcomes(task_outcomes(eps), env_id="e", split="train", policy_version=0, samples=2, seed=0,
                              budget={})
    by = {t.task_id: t for t in p.tasks}
    assert by["partial"].pass_rate == 0.0 and by["partial"].verdict == "mixed"
    assert (by["flat"].verdict, by["never"].verdict) == ("unsolved", "unsolved")
    assert p.skip_task_ids() == ["flat", "never"]
    assert TaskProfile.from_json(json.loads(json.dumps(p.to_json()))) == p  # the file keeps it
