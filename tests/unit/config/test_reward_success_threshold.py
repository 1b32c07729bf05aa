"""``reward.success_threshold``: the reward at or above which a judged episode succeeded
(default 0.5; any finite number)."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError


def test_the_success_threshold_defaults_to_a_half_and_takes_any_finite_number():
    assert load_config(None, []).reward.success_threshold == 0.5
    assert load_config(None, ["reward.success_threshold=0.9"]).reward.success_threshold == 0.9


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_threshold_is_refused_with_its_name(value):
    with pytest.raises(ConfigError, match="success_threshold"):
        load_config(None, [f"reward.success_threshold={value}"])
