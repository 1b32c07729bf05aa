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
    ("9" * 40, 10**18), ("-" + "9" * 40, -(10**18)), ("0" * 5000 + "5", 5), ("<guess>" + "0" * 5000 + "5</guess>", 5),
    ("3.5", 3), ("1e5", 1), ("\u0663", None), ("\uff13", None), ("5\u0663", 5),
    ("<GUESS>2</Guess> and <guess>7</guess>", 7), ("<guess>3", 3), ("<guess><guess>4</guess>", 4),
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


def test_feedback_invalid_out_of_range_and_out_of_guesses():
    env = GuessNumberEnv(low=1, high=10, max_guesses=3)
    tid = next(t for t in task_ids("train") if secret_of(t) == 6)
    env.reset(options={"task_id": tid})
    obs, r, term, trunc, info = env.step("hmm")
    assert info["invalid_action"] and "No number" in obs and (r, term, trunc) == (0.0, False, False)
    assert info["anchor"] == (tid, 1, 10)  # no information gained: same state
    obs, r, term, trunc, info = env.step("42")
    assert not info["invalid_action"] and "outside the range" in obs and info["anchor"] == (tid, 1, 10)
    obs, r, term, trunc, info = env.step("8")
    # the guess limit is a rule of the game: a lost game terminates, it is not truncated
    assert "too high" in obs and term and not trunc and r == 0.0 and "was 6" in obs and not info["success"]
    assert info["anchor"] == (tid, 1, 7)
    with pytest.raises(EnvError, match="ended"):
        env.step("6")


def test_huge_guess_is_a_valid_out_of_range_guess_not_an_error():
    env = GuessNumberEnv()
    env.reset(options={"task_id": "guess/0"})
    obs, r, term, trunc, info = env.step("<guess>" + "7" * 6000 + "</guess>")
    assert not info["invalid_action"] and "more than 18 digits is outside the range" in obs and len(obs) < 200


def test_a_flood_of_opening_tags_parses():
    # (a regex scan from every opening tag was quadratic: ~2 s for 8,000 tags, minutes here)
    assert parse_guess("<guess>" * 100_000) is None
    assert parse_guess("<guess>" * 100_000 + "6</guess>") == 6


def test_split_all_draws_from_both_splits_and_task_ids_are_canonical():
    env = GuessNumberEnv(split="all")
    splits = {env.reset(seed=i)[1]["split"] for i in range(400)}
    assert splits == {"train", "test"}
    for bad in ("guess/03", "guess/\u0663", "guess/-1", "guess/ 3"):
        with pytest.raises(ConfigError, match="decimal seed"):
            env.reset(options={"task_id": bad})


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
                            ({"split": "x"}, "split='x'"), ({"low": 1.5}, "low=1.5"),
                            ({"high": 2**63}, "2\\*\\*62")]:
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
