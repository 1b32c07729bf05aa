"""``agentrl/GuessNumber-v0``: parsing, feedback, the interval anchor, success and
truncation, splits, bad arguments, and the checker."""

from __future__ import annotations

import math

import pytest

import environments
from agentrl.errors import ConfigError, EnvError
from environments.checker import check_env, format_report
from environments.guess_number import GuessNumberEnv, parse_guess, secret_of, task_ids


@pytest.mark.parametrize("text, expected", [
    ("7", 7), ("I think 3.", 3), ("<guess>4</guess>", 4), ("maybe 2, no <guess>9</guess>", 9),
    ("first 5 then 6", 5), ("-3", -3), ("+8", 8), ("007", 7), ("no idea", None), ("<guess>x</guess>", None),
    ("9" * 40, None),
])
def test_parse_guess(text, expected):
    assert parse_guess(text) == expected


def test_bisection_solves_every_task_within_log2_guesses():
    env = GuessNumberEnv(low=1, high=10, max_guesses=4)
    for tid in task_ids("train")[:200]:
        _, info = env.reset(options={"task_id": tid})
        assert info["anchor"] == (tid, 1, 10)
        lo, hi = 1, 10
        for turn in range(1, 5):
            g = (lo + hi) // 2
            obs, r, term, trunc, info = env.step(f"<guess>{g}</guess>")
            if term:
                assert r == 1.0 and info["success"] and g == secret_of(tid) and not trunc
                break
            assert r == 0.0 and not info["success"]
            lo, hi = (g + 1, hi) if "too low" in obs else (lo, g - 1)
            assert info["anchor"] == (tid, lo, hi) and info["interval"] == (lo, hi)
        assert term and turn <= math.ceil(math.log2(11))


def test_feedback_invalid_out_of_range_and_truncation():
    env = GuessNumberEnv(low=1, high=10, max_guesses=3)
    tid = next(t for t in task_ids("train") if secret_of(t) == 6)
    env.reset(options={"task_id": tid})
    obs, r, term, trunc, info = env.step("hmm")
    assert info["invalid_action"] and "No number" in obs and (r, term, trunc) == (0.0, False, False)
    assert info["anchor"] == (tid, 1, 10)  # no information gained: same state
    obs, r, term, trunc, info = env.step("42")
    assert not info["invalid_action"] and "outside the range" in obs and info["anchor"] == (tid, 1, 10)
    obs, r, term, trunc, info = env.step("8")
    assert "too high" in obs and trunc and not term and r == 0.0 and "was 6" in obs
    assert info["anchor"] == (tid, 1, 7)
    with pytest.raises(EnvError, match="ended"):
        env.step("6")


def test_secret_depends_on_seed_and_range_and_is_uniform_enough():
    secrets = [secret_of(t) for t in task_ids("train")[:2000]]
    assert set(secrets) == set(range(1, 11))
    counts = [secrets.count(v) for v in range(1, 11)]
    assert min(counts) > 150 and max(counts) < 250  # 200 expected each
    assert all(1 <= secret_of(t, 1, 3) <= 3 for t in task_ids("test")[:50])
    assert not set(task_ids("train")) & set(task_ids("test"))
    assert GuessNumberEnv(split="test").reset(seed=1)[0].startswith("Guess the secret number from 1 to 10")


def test_bad_arguments_and_calls():
    for kwargs, pattern in [({"low": 5, "high": 5}, "high=5"), ({"max_guesses": 0}, "max_guesses=0"),
                            ({"split": "x"}, "split='x'"), ({"low": 1.5}, "low=1.5")]:
        with pytest.raises(ConfigError, match=pattern):
            GuessNumberEnv(**kwargs)
    env = GuessNumberEnv()
    with pytest.raises(EnvError, match="before reset"):
        env.step("3")
    with pytest.raises(ConfigError, match="'sokoban/1'"):
        env.reset(options={"task_id": "sokoban/1"})
    with pytest.raises(ConfigError, match="unknown reset options"):
        env.reset(options={"task_id": "guess/1", "x": 1})
    env.reset(options={"task_id": "guess/1"})
    with pytest.raises(EnvError, match="str"):
        env.step(3)  # type: ignore[arg-type]


def test_made_through_the_registry_and_passes_the_checker():
    env = environments.make_env("agentrl/GuessNumber-v0", low=1, high=20, max_guesses=6)
    assert "from 1 to 20" in env.reset(options={"task_id": "guess/3"})[0]
    report = check_env("agentrl/GuessNumber-v0")
    assert report.ok, format_report(report)
