"""The async benchmark's learnable environment (``tests/benchmarks/longtail_words_env.py``) and
its seed-spread learning-curve report (``tests/benchmarks/async_curves.py``)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import async_curves as curves  # noqa: E402
import longtail_env as lt  # noqa: E402
import longtail_words_env as lw  # noqa: E402

from agentrl.errors import ConfigError  # noqa: E402


def test_reward_is_the_share_of_plain_lowercase_words_and_steps_wait_the_guess_latency():
    waits: list[float] = []
    env = lw.LongTailWordsEnv(max_turns=3, slow_prob=0.5, latency_seed=2, sleep=waits.append)
    obs, info = env.reset(seed=4, options={"task_id": "words/9"})
    assert waits == [] and info["task_id"] == "words/9" and "lowercase" in info["system_prompt"]
    for k, (reply, share) in enumerate([("the cat Sat on, a mat 3", 4 / 7), ("", 0.0), ("ok so", 1.0)]):
        obs, reward, terminated, truncated, info = env.step(reply)
        assert reward == pytest.approx(share) == info["share"] and info["success"] is (share >= 0.8)
        assert waits[-1] == lt.step_latency_s("words/9", 4, k, slow_prob=0.5, latency_seed=2) == info["step_latency_s"]
        assert terminated == (k == 2) and not truncated
    assert obs == "2 of 2 words were plain lowercase words."
    env.reset(seed=4, options={"task_id": "words/9"})
    env.step("a b")
    assert waits[-1] == waits[0]  # a restarted episode waits the same again


def test_passes_the_env_checker_and_rejects_bad_settings():
    from environments.checker import check_env

    report = check_env(lw.ENV_ID, env_kwargs={"fast_step_s": 0.0, "slow_step_s": 0.0})
    assert report.problems == [] and report.checks_passed
    with pytest.raises(ConfigError, match="max_turns=0"):
        lw.LongTailWordsEnv(max_turns=0)
    with pytest.raises(ConfigError, match="success_share=1.5"):
        lw.LongTailWordsEnv(success_share=1.5)
    with pytest.raises(ConfigError, match="slow_prob=2"):
        lw.LongTailWordsEnv(slow_prob=2)


def test_bench_runs_with_the_words_env_still_differ_in_the_controller_only(tmp_path):
    import bench_async

    from agentrl.config import load_config

    args = argparse.Namespace(seed=3, iterations=3, tasks=2, group_size=2, max_staleness=2, partial_rollout="continue",
                              fast_step_s=0.2, slow_step_s=5.0, slow_prob=0.1, latency_seed=0, max_guesses=4,
                              max_new_tokens=24, advantage="grpo", lr=1e-4, set=[], env="words", engines=2)
    cfgs = {m: load_config(None, bench_async.overrides(args, m, "tiny-random-smollm2", tmp_path / m)).model_dump()
            for m in ("sync", "async")}
    diff = {(sec, k) for sec in cfgs["sync"] for k in cfgs["sync"][sec] if cfgs["sync"][sec][k] != cfgs["async"][sec][k]}
    assert diff == {("run", "dir"), ("run", "name"), ("controller", "mode")}
    c = cfgs["async"]
    assert c["env"]["id"] == lw.ENV_ID and c["env"]["kwargs"]["max_turns"] == 4 == c["rollout"]["max_turns"]
    assert c["rollout"]["num_engines"] == 2 and c["run"]["seed"] == 3


def _curve(rewards, tokens_per_it=100.0):
    return [{"iteration": i + 1, "rollout_tokens": tokens_per_it * (i + 1), "reward_mean": r, "success_rate": math.nan}
            for i, r in enumerate(rewards)]


def test_reward_at_budget_and_the_seed_verdict():
    c = _curve([0.1, 0.2, 0.3, 0.4])  # tokens 100..400
    assert curves.reward_at_budget(c, 400) == pytest.approx(0.35)  # iterations ending in (200, 400]
    assert curves.reward_at_budget(c, 300, window=1.0) == pytest.approx(0.2)
    assert math.isnan(curves.reward_at_budget(c, 50))
    with pytest.raises(ValueError, match="window=0"):
        curves.reward_at_budget(c, 100, window=0)
    cmp = curves.compare_seeds({"sync": [_curve([0.3, 0.5]), _curve([0.3, 0.7])],
                                "async": [_curve([0.3, 0.5], 90.0), _curve([0.3, 0.55], 110.0)]})
    assert cmp["budget_tokens"] == 180.0  # the fewest tokens any run made
    assert cmp["modes"]["sync"]["per_seed"] == [0.3, 0.3]  # only the first iteration ends within 180
    assert cmp["modes"]["async"]["per_seed"] == pytest.approx([0.5, 0.3])
    assert cmp["within_noise"] is True and cmp["difference"] == pytest.approx(0.1)
    assert cmp["se_difference"] == pytest.approx(math.sqrt(0.0 / 2 + (0.2 ** 2 / 2) / 2))  # async sd 0.141
    worse = curves.compare_seeds({"sync": [_curve([0.8, 0.8]), _curve([0.8, 0.8])],
                                  "async": [_curve([0.2, 0.2]), _curve([0.2, 0.21])]})
    assert worse["within_noise"] is False
    with pytest.raises(ValueError, match="at least one run per mode"):
        curves.compare_seeds({"sync": []})


def test_curves_svg_draws_one_line_per_run():
    svg = curves.curves_svg([("sync seed 0", "sync", _curve([0.1, 0.3])), ("async seed 0", "async", _curve([0.2, 0.4]))],
                            "reward", note="n")
    assert svg.count('class="curve"') == 2 and 'data-mode="async"' in svg and svg.startswith("<svg")
    with pytest.raises(ValueError, match="no curve"):
        curves.curves_svg([("x", "sync", [])], "t")


def test_pca_embeddings_keep_the_leading_directions_at_the_wanted_scale():
    import torch

    import semantic_tiny

    g = torch.Generator().manual_seed(0)
    base = torch.randn(500, 2, generator=g) * torch.tensor([5.0, 1.0])  # two strong directions
    source = base @ torch.randn(2, 12, generator=g) + 0.01 * torch.randn(500, 12, generator=g)  # (500, 12)
    out = semantic_tiny.pca_embeddings(source, 2, 0.02)
    assert out.shape == (500, 2) and abs(float(out.std()) - 0.02) < 1e-6
    # the projection keeps the source's geometry: distances agree up to one scale factor
    d_src = torch.cdist(source[:50] - source.mean(0), source[:50] - source.mean(0))
    d_out = torch.cdist(out[:50], out[:50])
    corr = torch.corrcoef(torch.stack([d_src.flatten(), d_out.flatten()]))[0, 1]
    assert float(corr) > 0.999
    with pytest.raises(ValueError, match="dim=13"):
        semantic_tiny.pca_embeddings(source, 13, 0.02)
