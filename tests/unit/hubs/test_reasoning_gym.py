"""``hub/ReasoningGym-v0``'s tasks: ids from the env kwargs (families, weights, size, seed),
held-out splits, lazy generation, difficulty settings, bad families and configs, and the
entry point that registers the id without importing reasoning_gym."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import gymnasium
import pytest

import agentrl.hubs
from agentrl.errors import ConfigError
from agentrl.hubs.reasoning_gym import ENV_ID, TEST_SEED_OFFSET, Mix, ReasoningGymEnv, _dataset, parse_task_id
from environments.checker import task_ids_of
from environments.registry import make_env

pytest.importorskip("reasoning_gym")

REPO = Path(__file__).resolve().parents[3]


def test_the_ids_follow_the_families_their_weights_and_size():
    ids = ReasoningGymEnv.task_ids("train", env_kwargs={"families": {"countdown": 2, "spell_backward": 1}, "size": 4})
    # interleaved, so any prefix (eval.num_tasks) holds every family
    assert ids == ["countdown/s0/0", "spell_backward/s0/0", "countdown/s0/1", "spell_backward/s0/1", "countdown/s0/2",
                   "countdown/s0/3"]
    # a list is equal weights, size per family; a single name is a one-family env
    assert len(ReasoningGymEnv.task_ids("train", env_kwargs={"families": ["gcd", "lcm", "dice"], "size": 5})) == 15
    assert ReasoningGymEnv.task_ids("test", env_kwargs={"families": "gcd", "size": 2, "seed": 7}) == [
        f"gcd/s{7 + TEST_SEED_OFFSET}/0", f"gcd/s{7 + TEST_SEED_OFFSET}/1"]
    # the defaults are the constructor's
    assert ReasoningGymEnv.task_ids("train") == Mix.from_kwargs({}).task_ids("train")
    assert ReasoningGymEnv.task_ids("train")[0] == "basic_arithmetic/s0/0"


def test_train_and_test_are_held_out_and_all_is_both():
    kw = {"families": ["basic_arithmetic", "spell_backward"], "size": 50}
    train, test = (ReasoningGymEnv.task_ids(s, env_kwargs=kw) for s in ("train", "test"))
    assert not set(train) & set(test) and ReasoningGymEnv.task_ids("all", env_kwargs=kw) == train + test
    env = ReasoningGymEnv(**kw)
    questions = {s: {env.reset(options={"task_id": t})[0] for t in ids} for s, ids in (("train", train), ("test", test))}
    assert not questions["train"] & questions["test"]  # different items, not only different ids
    _, info = env.reset(options={"task_id": test[0]})
    assert info["split"] == "test" and env.mix.split_of(train[0]) == "train"


def test_env_task_ids_passes_the_env_kwargs_to_a_task_ids_that_takes_them():
    from agentrl.cluster.actors.env_factory import env_task_ids

    agentrl.hubs.register()
    kw = {"families": {"countdown": 1, "gcd": 0.5}, "size": 6, "attempts": 2}
    assert env_task_ids(ENV_ID, "train", (), kw) == ReasoningGymEnv.task_ids("train", env_kwargs=kw)
    assert len(env_task_ids(ENV_ID, "train", (), kw)) == 9
    assert env_task_ids("agentrl/GuessNumber-v0", "test", (), {"low": 1, "high": 5})[0] == "guess/1000000"
    with pytest.raises(ConfigError, match="'countdwn' is not a reasoning-gym family; did you mean 'countdown'"):
        env_task_ids(ENV_ID, "train", (), {"families": "countdwn"})

    def plain(split):
        return [split]

    def forwards(*a, **k):  # a wrapper forwarding to a task_ids(split): env kwargs are not passed on
        return plain(*a, **k)

    def takes(split, *, env_kwargs=None):
        return [split, env_kwargs]

    assert task_ids_of(plain, "train", {"x": 1}) == ["train"] == task_ids_of(forwards, "train", {"x": 1})
    assert task_ids_of(takes, "test", {"x": 1}) == ["test", {"x": 1}] and task_ids_of(takes, "test") == ["test", {}]


def test_generation_is_lazy_one_item_per_reset(monkeypatch):
    kw = {"families": "basic_arithmetic", "size": 10**6}
    start = time.perf_counter()
    ids = ReasoningGymEnv.task_ids("train", env_kwargs=kw)
    env = ReasoningGymEnv(**kw)
    _dataset.cache_clear()
    obs, _ = env.reset(options={"task_id": ids[-1]})
    assert len(ids) == 10**6 and obs and time.perf_counter() - start < 20
    ds, _ = _dataset("basic_arithmetic", 0, 10**6, "{}")
    calls = []
    original = type(ds).__getitem__
    monkeypatch.setattr(type(ds), "__getitem__", lambda self, i: calls.append(i) or original(self, i))
    env.reset(options={"task_id": "basic_arithmetic/s0/123456"})
    env.reset(seed=3)  # drawn from the split without listing it
    assert len(calls) == 2 and calls[0] == 123456
    assert _dataset.cache_info().currsize == 1  # made once, reused by every reset of the process


def test_a_drawn_task_is_seeded_and_from_the_split():
    env = ReasoningGymEnv(families=["gcd", "lcm"], size=20, split="test")
    a = env.reset(seed=5)[1]["task_id"]
    assert env.reset(seed=5)[1]["task_id"] == a and env.mix.split_of(a) == "test"


def test_difficulty_settings_reach_the_generator():
    easy = ReasoningGymEnv(families="basic_arithmetic", config={"basic_arithmetic": {"min_terms": 2, "max_terms": 2,
                                                                                       "min_digits": 1, "max_digits": 1}})
    hard = ReasoningGymEnv(families="basic_arithmetic", config={"basic_arithmetic": {"min_terms": 6, "max_terms": 6,
                                                                                       "min_digits": 3, "max_digits": 3}})
    q_easy = easy.reset(options={"task_id": "basic_arithmetic/s0/0"})[0]
    q_hard = hard.reset(options={"task_id": "basic_arithmetic/s0/0"})[0]
    assert q_easy != q_hard and len(q_hard) > len(q_easy)


def test_a_bad_family_names_it_and_its_close_matches():
    for call in (lambda: ReasoningGymEnv(families="countdwn"),
                 lambda: ReasoningGymEnv.task_ids("train", env_kwargs={"families": {"spell_backwards": 1}}),
                 lambda: make_env(ENV_ID, families=["gcd", "countdwn"])):
        with pytest.raises(ConfigError, match=r"'(countdwn|spell_backwards)' is not a reasoning-gym family; did "
                                              r"you mean '(countdown|spell_backward)'"):
            call()
    with pytest.raises(ConfigError, match=r"'qwertyuiop' is not a reasoning-gym family \(reasoning-gym has"):
        ReasoningGymEnv(families="qwertyuiop")


@pytest.mark.parametrize("kwargs, match", [
    ({"families": []}, "non-empty list"),
    ({"families": ["gcd", "gcd"]}, "names a family twice"),
    ({"families": {"gcd": 0}}, "weight > 0"),
    ({"families": {"gcd": True}}, "weight > 0"),
    ({"families": {"gcd": 1, "lcm": 0.01}, "size": 10}, r"\['lcm'\] get no task"),
    ({"size": 0}, "size=0 must be an int >= 1"),
    ({"seed": -1}, "seed=-1 must be an int >= 0"),
    ({"seed": 2**32}, "must be <= 2\\*\\*32"),
    ({"families": "gcd", "config": {"lcm": {}}}, r"config names \['lcm'\]"),
    ({"families": "gcd", "config": {"gcd": {"size": 3}}}, "are env kwargs"),
    ({"families": "gcd", "config": {"gcd": {"min_numbres": 3}}}, r"\['min_numbres'\] are not fields of GCDConfig"),
    ({"families": "gcd", "config": {"gcd": {"min_numbers": 5, "max_numbers": 2}}}, "refused by reasoning-gym"),
    ({"families": "gcd", "attempt": 2}, r"unknown env kwargs \['attempt'\]"),
])
def test_bad_kwargs_are_config_errors_naming_the_value(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ReasoningGymEnv.task_ids("train", env_kwargs=kwargs)


def test_bad_env_arguments_and_task_ids():
    with pytest.raises(ConfigError, match="attempts=0"):
        ReasoningGymEnv(attempts=0)
    with pytest.raises(ConfigError, match="split='dev'"):
        ReasoningGymEnv(split="dev")
    for bad in (0, -1.0, float("inf"), True, "10"):
        with pytest.raises(ConfigError, match="score_timeout_s=.* must be a finite number of seconds > 0"):
            ReasoningGymEnv(score_timeout_s=bad)
    assert ReasoningGymEnv(score_timeout_s=2).score_timeout_s == 2.0
    assert ReasoningGymEnv.task_ids("train", env_kwargs={"families": "gcd", "size": 2, "score_timeout_s": 5}) == [
        "gcd/s0/0", "gcd/s0/1"]
    with pytest.raises(ConfigError, match="split='dev'"):
        ReasoningGymEnv.task_ids("dev")
    env = ReasoningGymEnv(families="gcd", size=10)
    for task_id, match in (("lcm/s0/1", "family 'lcm' is not one of"), ("gcd/s0/10", "not below size=10"),
                           ("gcd/s0/01", "expected '<family>/s<seed>/<index>'"), ("gcd/0/1", "not a hub/")):
        with pytest.raises(ConfigError, match=match):
            env.reset(options={"task_id": task_id})
    assert parse_task_id("countdown/s0/17") == ("countdown", 0, 17)


def test_import_environments_registers_the_hub_id_without_importing_reasoning_gym():
    code = ("import sys, gymnasium, environments\n"
            f"print({ENV_ID!r} in gymnasium.registry, 'reasoning_gym' in sys.modules)\n"
            f"env = environments.make_env({ENV_ID!r})\n"
            "print(type(env.unwrapped).__name__, 'reasoning_gym' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "ReasoningGymEnv", "True"], out.stdout
    assert ENV_ID in gymnasium.registry and agentrl.hubs.register() == []  # idempotent


def test_the_example_config_lists_every_family_in_its_eval_prefix_and_passes_the_checker():
    from agentrl.config import load_config
    from environments.checker import check_env, format_report

    cfg = load_config(REPO / "examples" / "reasoning_gym_mix.yaml")
    kw = cfg.env.kwargs
    assert cfg.env.id == ENV_ID and cfg.rollout.max_turns >= kw["attempts"] and cfg.eval.max_turns >= kw["attempts"]
    first = ReasoningGymEnv.task_ids(cfg.eval.split, env_kwargs=kw)[: cfg.eval.num_tasks]
    assert {t.split("/")[0] for t in first} == set(kw["families"])
    assert not set(first) & set(ReasoningGymEnv.task_ids(cfg.env.split, env_kwargs=kw))
    agentrl.hubs.register()
    report = check_env(ENV_ID, env_kwargs=kw)
    assert report.ok, format_report(report)
