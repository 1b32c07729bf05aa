"""``env.group_size`` against the estimator's registration: a group-relative estimator
(grpo, rloo, drgrpo, or a user's registered with ``min_group_size=2``) with a group of one
gets advantage 0 on every token and never learns, so a run is refused at start-up; gigpo
starts with a warning (its step groups still compare revisited states); dynamic sampling
with a group of one would drop every group."""

from __future__ import annotations

import logging

import pytest

import critics
from agentrl.config import load_config
from agentrl.credit import assign_credit
from agentrl.credit.group_size import check_group_size
from agentrl.errors import ConfigError
from agentrl.types import Episode, SamplingRecord, TerminationReason, Turn


def _cfg(*overrides: str):
    return load_config(None, list(overrides))


def _ep(group: str, rewards: list[float], anchors: list[str]) -> Episode:
    ep = Episode(group_id=group, env_id="e", task_id=group, seed=0, terminated=True,
                 termination_reason=TerminationReason.ENV_TERMINATED)
    for r, a in zip(rewards, anchors):
        ep.turns.append(Turn(prompt_ids=[1], completion_ids=[5], behavior_log_probs=[-0.5], reward=r, anchor=a))
    return ep


@pytest.mark.parametrize("advantage", ["grpo", "rloo", "drgrpo"])
def test_a_group_relative_estimator_with_groups_of_one_is_refused(advantage):
    # what the run would train on: every advantage 0 (one episode per group)
    eps = [_ep(f"g{i}", [float(i % 2)], ["s"]) for i in range(4)]
    res = assign_credit(eps, load_config(None, [f"algorithm.advantage={advantage}"]).algorithm, SamplingRecord())
    assert all(a == [0.0] for a in res.turn_advantages.values())
    cfg = _cfg(f"algorithm.advantage={advantage}", "env.group_size=1")
    with pytest.raises(ConfigError) as info:
        check_group_size(cfg)
    msg = str(info.value)
    assert f"env.group_size=1 with algorithm.advantage={advantage!r}" in msg
    assert "needs at least 2 rollouts per task instance" in msg and "never learn" in msg
    assert "set env.group_size >= 2" in msg and "gae" in msg and "turn_critic" in msg  # what to use instead (a user's estimator registered by another test may stand between them)
    assert "\n" not in msg


@pytest.mark.parametrize("advantage", ["grpo", "rloo", "drgrpo", "gigpo", "turn_critic", "gae"])
def test_groups_of_two_or_more_pass_silently(advantage):
    assert check_group_size(_cfg(f"algorithm.advantage={advantage}", "env.group_size=2")) == []


@pytest.mark.parametrize("advantage", ["turn_critic", "gae"])
def test_a_critic_needs_no_group(advantage):
    assert check_group_size(_cfg(f"algorithm.advantage={advantage}", "env.group_size=1")) == []


def test_gigpo_with_groups_of_one_warns_and_still_learns_from_revisited_states():
    warnings = check_group_size(_cfg("algorithm.advantage=gigpo", "env.group_size=1"))
    assert len(warnings) == 1
    assert "env.group_size=1 with algorithm.advantage='gigpo', below its advised group size 2" in warnings[0]
    assert "episode-level advantage (Feng et al. 2025, Eq. 3) is 0" in warnings[0]
    # what the warning says: the episode level is 0, and a trajectory that revisits anchor s
    # still gets a step-level signal (returns 1 and 0 at s, gamma 1: mean 0.5; x alone: 0)
    res = assign_credit([_ep("g", [1.0, 0.0, 0.0], ["s", "x", "s"])],
                        _cfg("algorithm.advantage=gigpo", "algorithm.gamma=1.0").algorithm, SamplingRecord())
    adv = next(iter(res.turn_advantages.values()))
    assert adv == pytest.approx([0.5, 0.0, -0.5])  # s visited with returns 1 and 0: mean 0.5


def test_a_users_estimator_declares_its_group_needs(registered):
    def pairwise(rewards, anchors, group_ids, values, params):
        return [[0.0] * len(r) for r in rewards]

    registered("pairwise_test", pairwise, min_group_size=3, group_size_note="it compares three rollouts")
    with pytest.raises(ConfigError, match=r"env.group_size=2 with algorithm.advantage='pairwise_test': the estimator "
                                          r"needs at least 3 rollouts per task instance \(it compares three rollouts\)"):
        check_group_size(_cfg("algorithm.advantage=pairwise_test", "env.group_size=2"))
    assert check_group_size(_cfg("algorithm.advantage=pairwise_test", "env.group_size=3")) == []
    registered("soft_test", pairwise, advised_group_size=4)
    assert "below its advised group size 4" in check_group_size(_cfg("algorithm.advantage=soft_test",
                                                                      "env.group_size=3"))[0]


def test_dynamic_sampling_with_groups_of_one_is_refused_for_any_estimator():
    with pytest.raises(ConfigError, match=r"env.group_size=1 with algorithm.dynamic_sampling=true: .* a group of "
                                          r"one always is"):
        check_group_size(_cfg("algorithm.advantage=turn_critic", "algorithm.dynamic_sampling=true",
                              "env.group_size=1"))


def test_a_config_with_groups_of_one_still_loads_for_evaluation():
    # evaluation builds its config with env.group_size = eval.samples (1 is pass@1 only) and
    # computes no advantage: the check belongs to a training run's start-up, not to loading
    cfg = _cfg("env.group_size=1", "eval.samples=1")
    assert cfg.env.group_size == 1 and cfg.algorithm.advantage == "grpo"


def test_train_refuses_before_ray_starts(tmp_path):
    import ray

    from agentrl.driver.controller import train

    cfg = _cfg("env.group_size=1", f"run.dir={tmp_path / 'run'}", "sandbox.backend=bwrap")
    assert not ray.is_initialized()
    with pytest.raises(ConfigError, match=r"env.group_size=1 with algorithm.advantage='grpo'"):
        train(cfg)
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


def test_train_logs_the_gigpo_warning_once(tmp_path, caplog):
    from agentrl.driver.controller import train

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "latest").mkdir(parents=True)  # stops train() right after its first checks
    cfg = _cfg("algorithm.advantage=gigpo", "env.group_size=1", f"run.dir={run_dir}")
    with caplog.at_level(logging.WARNING, logger="agentrl.driver.controller"), \
            pytest.raises(ConfigError, match="already holds a run"):
        train(cfg)
    hits = [r for r in caplog.records if "advised group size" in r.getMessage()]
    assert len(hits) == 1 and hits[0].levelno == logging.WARNING


def test_the_builtins_declare_their_group_needs():
    needs = {n: (critics.get_estimator(n).min_group_size, critics.get_estimator(n).advised_group_size)
             for n in ("grpo", "rloo", "drgrpo", "gigpo", "turn_critic", "gae")}
    assert needs == {"grpo": (2, 2), "rloo": (2, 2), "drgrpo": (2, 2), "gigpo": (1, 2),
                     "turn_critic": (1, 1), "gae": (1, 1)}


@pytest.mark.parametrize("kw, match", [
    ({"min_group_size": 0}, r"min_group_size=0; expected an integer >= 1"),
    ({"min_group_size": 2.5}, r"min_group_size=2.5; expected an integer >= 1"),
    ({"min_group_size": True}, r"min_group_size=True; expected an integer >= 1"),
    ({"min_group_size": 3, "advised_group_size": 2}, r"advised_group_size=2 is smaller than min_group_size=3"),
])
def test_bad_group_needs_are_refused_at_registration(kw, match):
    with pytest.raises(ConfigError, match=match):
        critics.register_estimator("bad_group_test", lambda r, a, g, v, p: r, **kw)
    assert "bad_group_test" not in critics.ESTIMATORS


def test_the_decorator_passes_the_group_needs_on(registered):
    @critics.register_estimator("decorated_group_test", min_group_size=2)
    def est(rewards, anchors, group_ids, values, params):
        return [[0.0] * len(r) for r in rewards]

    try:
        assert critics.get_estimator("decorated_group_test").min_group_size == 2
    finally:
        critics.ESTIMATORS.pop("decorated_group_test", None)
