"""``trainer.kl.estimator`` defaults by ``trainer.kl.mode``: k1 in the reward (its policy
gradient is exactly that of KL(current || reference); k2 and k3 there bias it), k3 in the
loss (the value reported as ``actor/kl_loss``; the gradient is the same for every
estimator). Naming k2 or k3 for a reward penalty is accepted (stored runs keep loading
unchanged) with a warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from agentrl.driver.checkpoint import RunDir
from agentrl.config import KLSection, code_defaults, trainer_configs
from agentrl.trainer.config import KL_DEFAULT_ESTIMATORS, KLConfig, TrainerConfig

REWARD_WARNING = r"kl\.estimator='k3' with kl\.mode='reward'.*biased policy gradient"


def test_the_estimator_follows_the_mode_when_not_named() -> None:
    assert KL_DEFAULT_ESTIMATORS == {"reward": "k1", "loss": "k3"}
    assert code_defaults().trainer.kl.estimator == "k3"  # loss mode: the reported value is unchanged
    reward = code_defaults(["trainer.kl.mode=reward", "trainer.kl.coef=0.05"])
    assert reward.trainer.kl.estimator == "k1"
    policy, _ = trainer_configs(reward, "<model>")
    assert policy.kl.estimator == "k1"  # what the trainer scores the penalty with
    assert KLSection(mode="reward").estimator == "k1" and KLSection().estimator == "k3"
    assert KLConfig(mode="reward").estimator == "k1" and KLConfig().estimator == "k3"


def test_a_named_estimator_is_kept() -> None:
    for est in ("k1", "k2", "k3"):
        assert code_defaults([f"trainer.kl.estimator={est}"]).trainer.kl.estimator == est
    assert KLConfig(mode="reward", estimator="k1").estimator == "k1"


def test_a_reward_penalty_with_k3_warns_and_loads() -> None:
    with pytest.warns(UserWarning, match=REWARD_WARNING):
        cfg = code_defaults(["trainer.kl.mode=reward", "trainer.kl.estimator=k3", "trainer.kl.coef=0.05"])
    assert cfg.trainer.kl.estimator == "k3"
    with pytest.warns(UserWarning, match=r"kl\.estimator='k2' with kl\.mode='reward'"):
        TrainerConfig(model_path="m", kl=KLConfig(coef=0.1, estimator="k2", mode="reward")).validate()


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.kl.mode=reward", "trainer.kl.estimator=k1", "trainer.kl.coef=0.05"],  # the right one
        ["trainer.kl.mode=reward", "trainer.kl.estimator=k3"],  # no penalty (coef 0)
        ["trainer.kl.estimator=k3", "trainer.kl.coef=0.05"],  # the loss
        ["trainer.kl.estimator=k2", "trainer.kl.coef=0.05"],
    ],
)
def test_no_warning_otherwise(overrides: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code_defaults(overrides)


@pytest.mark.parametrize(("mode", "stored", "loaded"), [("loss", "k3", "k3"), ("reward", "k1", "k1"), ("reward", "k3", "k3")])
def test_stored_configs_load_unchanged(tmp_path: Path, mode: str, stored: str, loaded: str) -> None:
    """A run directory's ``config.yaml`` names the estimator it ran with (the dump of a
    validated config never holds None), and resuming keeps it, the old default k3 of a
    reward-mode run included (with the warning)."""
    rd = RunDir(tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = code_defaults([f"trainer.kl.mode={mode}", f"trainer.kl.estimator={stored}", "trainer.kl.coef=0.05"])
        rd.write_config(cfg.model_dump(mode="json"))
        assert yaml.safe_load(rd.config_path.read_text())["trainer"]["kl"]["estimator"] == stored
        assert rd.load_config([]).trainer.kl.estimator == loaded


def test_a_stored_config_without_the_key_takes_the_modes_default(tmp_path: Path) -> None:
    data = code_defaults().model_dump(mode="json")
    data["trainer"]["kl"] = {"coef": 0.05, "mode": "reward"}
    rd = RunDir(tmp_path / "run")
    rd.write_config(data)
    assert rd.load_config([]).trainer.kl.estimator == "k1"
    data["trainer"]["kl"] = {"coef": 0.05, "mode": "loss", "estimator": None}
    rd.write_config(data)
    assert rd.load_config([]).trainer.kl.estimator == "k3"
