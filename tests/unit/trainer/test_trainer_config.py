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
    TrainerConfig(model_path="m", max_grad_norm=None, micro_batch_tokens=None, temperature=None).validate()


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
