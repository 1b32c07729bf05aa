"""What the driver checks of a judge before anything starts (agentrl/cluster/actors/judge_service.py,
agentrl/config/reward_sections.py): a rubric template that names a variable that does not
exist, a pool whose max_tokens cannot hold a whole group's answer, and secrets in the config
never printed back."""

from __future__ import annotations

import pytest

from agentrl.cluster.actors.judge_service import check_rubric
from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.rewards.rubric import Criterion, Rubric

BASE = ["env.id=agentrl/MathAnswer-v0", "reward.judge.model=m"]


def test_a_template_typo_stops_the_run_at_start_up():
    cfg = load_config(None, BASE + ["reward.judge.base_url=http://127.0.0.1:1/v1"])
    with pytest.raises(ConfigError, match="'refrence' is undefined"):
        check_rubric(cfg, Rubric("t", (Criterion("a", "d"),), template="{{ task }} {{ refrence }}"))
    check_rubric(cfg, Rubric("t", (Criterion("a", "d"),), template="{{ task }} {{ reference }} {{ answer }}"))


def test_a_pool_too_short_for_a_whole_group_answer_is_refused():
    group = Rubric("g", (Criterion("a", "d"), Criterion("b", "e")), mode="group")
    short = load_config(None, BASE + ["env.group_size=16", "reward.judge.kind=pool", "reward.judge.max_tokens=256"])
    with pytest.raises(ConfigError, match="max_tokens=256: a group of env.group_size=16"):
        check_rubric(short, group)
    check_rubric(load_config(None, BASE + ["env.group_size=16", "reward.judge.kind=pool",
                                           "reward.judge.max_tokens=2048"]), group)


@pytest.mark.parametrize("override", [
    "reward.judge.api_key_env=sk-live-0123456789abcdef",
    "reward.judge.base_url=http://user:sk-live-0123456789abcdef@judge:8000/v1",
    "reward.judge.base_url=http://judge:8000/v1?api_key=sk-live-0123456789abcdef",
    "reward.judge.api_key=sk-live-0123456789abcdef",
])
def test_a_secret_in_the_config_is_refused_and_never_printed_back(override):
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + ["reward.judge.base_url=http://judge:8000/v1", override])
    assert "0123456789abcdef" not in str(err.value) and "api_key_env" in str(err.value)
