"""TrainerConfig validation: every bad value is named in a ConfigError."""

from __future__ import annotations

import dataclasses

import pytest

from agentrl.errors import ConfigError
from agentrl.trainer import TrainerConfig


def test_defaults_are_valid() -> None:
    cfg = TrainerConfig(model_path="/some/model")
    cfg.validate()
    assert cfg.dtype == "float32" and cfg.device == "cpu" and cfg.loss_agg_mode == "token-mean"
    assert cfg.clip_ratio_low == 0.2 and cfg.clip_ratio_high == 0.2 and cfg.temperature is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model_path", "", "model_path=''"),
        ("dtype", "float16", "dtype='float16'"),
        ("device", "tpu", "device='tpu'"),
        ("lr", 0.0, "lr=0.0"),
        ("weight_decay", -0.1, "weight_decay=-0.1"),
        ("betas", (0.9, 1.0), r"betas=\(0.9, 1.0\)"),
        ("eps", 0.0, "eps=0.0"),
        ("max_grad_norm", 0.0, "max_grad_norm=0.0"),
        ("warmup_steps", -1, "warmup_steps=-1"),
        ("micro_batch_size", 0, "micro_batch_size=0"),
        ("micro_batch_tokens", 0, "micro_batch_tokens=0"),
        ("ppo_epochs", 0, "ppo_epochs=0"),
        ("clip_ratio_low", 1.0, "clip_ratio_low=1.0"),
        ("clip_ratio_high", -0.2, "clip_ratio_high=-0.2"),
        ("loss_agg_mode", "sum", "loss_agg_mode='sum'"),
        ("temperature", 0.0, "temperature=0.0"),
        ("logprob_chunk_tokens", 0, "logprob_chunk_tokens=0"),
        ("seed", 1.5, "seed=1.5"),
    ],
)
def test_invalid_field_is_named(field: str, value: object, message: str) -> None:
    cfg = dataclasses.replace(TrainerConfig(model_path="/some/model"), **{field: value})
    with pytest.raises(ConfigError, match=message):
        cfg.validate()


def test_optional_fields_accept_none() -> None:
    cfg = TrainerConfig(model_path="m", max_grad_norm=None, micro_batch_tokens=None, temperature=None)
    cfg.validate()  # None means "off" (no clipping, no token budget, the batch's own temperature)
    assert (cfg.max_grad_norm, cfg.micro_batch_tokens, cfg.temperature) == (None, None, None)


_SHARED = [
    ("model_path", "", "model_path=''"), ("dtype", "float16", "dtype='float16'"), ("device", "tpu", "device='tpu'"),
    ("lr", 0.0, "lr=0.0"), ("weight_decay", -0.1, "weight_decay=-0.1"), ("betas", (0.9, 1.0), r"betas=\(0.9, 1.0\)"),
    ("eps", 0.0, "eps=0.0"), ("max_grad_norm", 0.0, "max_grad_norm=0.0"), ("warmup_steps", -1, "warmup_steps=-1"),
    ("micro_batch_size", 0, "micro_batch_size=0"), ("micro_batch_tokens", 0, "micro_batch_tokens=0"),
    ("seed", 1.5, "seed=1.5"),
]


@pytest.mark.parametrize(("field", "value", "message"), _SHARED)
def test_critic_config_checks_the_shared_fields_the_same_way(field: str, value: object, message: str) -> None:
    from agentrl.trainer import CriticConfig

    cfg = dataclasses.replace(CriticConfig(model_path="/some/model"), **{field: value})
    with pytest.raises(ConfigError, match=message):
        cfg.validate()
    CriticConfig(model_path="/some/model").validate()


# ---------------------------------------------------------------- from the run config


def test_trainer_configs_maps_every_section_field() -> None:
    from agentrl.config import load_config, trainer_configs
    from agentrl.trainer import CriticConfig, TrainerConfig

    cfg = load_config(None, [
        "run.seed=7", "model.dtype=bfloat16", "trainer.lr=2e-6", "trainer.weight_decay=0.01",
        "trainer.max_grad_norm=0.5", "trainer.warmup_steps=3", "trainer.ppo_epochs=2",
        "trainer.micro_batch_size=2", "trainer.micro_batch_tokens=512", "trainer.gradient_checkpointing=true",
        "trainer.clip_ratio_low=0.1", "trainer.clip_ratio_high=0.28", "trainer.loss_agg_mode=seq-mean-token-mean",
        "algorithm.advantage=gae", "critic.lr=3e-5", "critic.value_clip=0.5", "critic.head_init_std=0.02",
        "critic.epochs=2", "critic.micro_batch_size=8", "critic.warmup_steps=1",
    ])
    policy, critic = trainer_configs(cfg, "/models/policy")
    assert policy == TrainerConfig(
        model_path="/models/policy", dtype="bfloat16", device="cpu", seed=7, lr=2e-6, weight_decay=0.01,
        max_grad_norm=0.5, warmup_steps=3, ppo_epochs=2, micro_batch_size=2, micro_batch_tokens=512,
        gradient_checkpointing=True, clip_ratio_low=0.1, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean",
    )
    assert critic == CriticConfig(
        model_path="/models/policy", dtype="bfloat16", device="cpu", seed=7, lr=3e-5, value_clip=0.5,
        head_init_std=0.02, epochs=2, micro_batch_size=8, warmup_steps=1,
    )
    policy.validate()
    critic.validate()


def test_trainer_configs_defaults_match_the_dataclass_defaults() -> None:
    """An empty run config trains with the dataclasses' own defaults (except the run's
    seed and dtype), and without a critic unless the estimator needs one."""
    from agentrl.config import load_config, trainer_configs
    from agentrl.trainer import CriticConfig, TrainerConfig

    policy, critic = trainer_configs(load_config(None), "m")
    assert critic is None
    assert policy == TrainerConfig(model_path="m")
    _, critic = trainer_configs(load_config(None, ["algorithm.advantage=turn_critic", "critic.model_path=c"]), "m")
    assert critic == CriticConfig(model_path="c")


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.clip_ratio_low=1.0", "clip_ratio_low=1.0; expected 0 <= value < 1"),
    ("trainer.clip_ratio_high=-0.2", "clip_ratio_high=-0.2; expected >= 0"),
])
def test_run_config_checks_clip_ratios_with_the_trainer_check(override: str, message: str) -> None:
    from agentrl.config import load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
