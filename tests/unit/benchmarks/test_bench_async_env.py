"""The async benchmark's environment (``tests/benchmarks/longtail_env.py``): GuessNumber with a
seeded long-tailed latency per step, and the bench's two configs, which differ in
``controller.*`` (and the run's directory and name) only."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import longtail_env as lt  # noqa: E402

from agentrl.errors import ConfigError, EnvError  # noqa: E402
from environments.guess_number import GuessNumberEnv  # noqa: E402


def test_latency_is_deterministic_and_long_tailed():
    draws = [lt.step_latency_s(f"guess/{t}", t, s) for t in range(2000) for s in range(5)]
    assert draws == [lt.step_latency_s(f"guess/{t}", t, s) for t in range(2000) for s in range(5)]
    assert set(draws) == {0.2, 5.0}
    assert 0.08 < draws.count(5.0) / len(draws) < 0.12  # one step in ten, 10,000 draws
    other = [lt.step_latency_s(f"guess/{t}", t, s, latency_seed=1) for t in range(2000) for s in range(5)]
    assert other != draws  # the latency seed changes which steps are slow
    assert {lt.step_latency_s("guess/1", 1, s, slow_prob=0.0) for s in range(50)} == {0.2}
    assert {lt.step_latency_s("guess/1", 1, s, slow_prob=1.0, slow_step_s=3.0) for s in range(50)} == {3.0}


@pytest.mark.parametrize("kwargs, match", [
    ({"fast_step_s": -0.1}, "fast_step_s=-0.1"), ({"slow_step_s": float("inf")}, "slow_step_s=inf"),
    ({"slow_prob": 1.5}, "slow_prob=1.5"), ({"slow_prob": True}, "slow_prob=True"),
])
def test_bad_latency_settings_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        lt.LongTailGuessEnv(**kwargs)


def test_the_game_is_guess_number_with_each_step_waiting_its_latency():
    waits: list[float] = []
    env = lt.LongTailGuessEnv(slow_prob=0.5, latency_seed=3, sleep=waits.append)
    plain = GuessNumberEnv()
    obs, info = env.reset(seed=7, options={"task_id": "guess/42"})
    assert (obs, info) == plain.reset(seed=7, options={"task_id": "guess/42"}) and waits == []  # reset never waits
    for k, guess in enumerate(["5", "no idea", "3", "8", "1"]):
        got, want = env.step(guess), plain.step(guess)
        expected = lt.step_latency_s("guess/42", 7, k, slow_prob=0.5, latency_seed=3)
        assert got[:4] == want[:4] and got[4]["step_latency_s"] == expected
        assert {k: v for k, v in got[4].items() if k != "step_latency_s"} == want[4]
        assert waits[-1] == expected and len(waits) == k + 1
        if got[2]:
            break
    env.reset(seed=7, options={"task_id": "guess/42"})
    env.step("5")
    assert waits[-1] == waits[0]  # a restarted episode waits the same again
    with pytest.raises(EnvError, match="before reset"):
        lt.LongTailGuessEnv(sleep=waits.append).step("5")


def test_registered_for_the_run_with_the_game_tasks():
    from agentrl.cluster.actors.env_factory import env_task_ids
    from environments.registry import env_class

    assert env_class(lt.ENV_ID) is lt.LongTailGuessEnv and lt.LongTailGuessEnv.uses_sandbox is False
    assert env_task_ids(lt.ENV_ID, "test", ["longtail_env"])[:2] == ["guess/1000000", "guess/1000001"]


def test_the_two_runs_differ_in_the_controller_only(tmp_path):
    import bench_async

    from agentrl.config import load_config

    args = argparse.Namespace(seed=0, iterations=3, tasks=2, group_size=2, max_staleness=2, partial_rollout="drain",
                              fast_step_s=0.2, slow_step_s=5.0, slow_prob=0.1, latency_seed=0, max_guesses=5,
                              max_new_tokens=24, advantage="grpo", lr=1e-6, set=[])
    cfgs = {m: load_config(None, bench_async.overrides(args, m, "tiny-random-smollm2", tmp_path / m)).model_dump()
            for m in ("sync", "async")}
    diff = {(sec, k) for sec in cfgs["sync"] for k in cfgs["sync"][sec] if cfgs["sync"][sec][k] != cfgs["async"][sec][k]}
    assert diff == {("run", "dir"), ("run", "name"), ("controller", "mode")}
    c = cfgs["async"]
    assert c["controller"] == {"mode": "async", "max_staleness": 2, "partial_rollout": "drain"}
    assert c["env"]["id"] == lt.ENV_ID and c["env"]["kwargs"]["slow_step_s"] == 5.0
    assert c["rollout"]["env_workers"] >= 3 * 2 * 2  # no step waits for a thread with (k+1) x B groups in flight
    assert c["run"]["checkpoint_every"] == 3  # one checkpoint, at the end, in both runs
