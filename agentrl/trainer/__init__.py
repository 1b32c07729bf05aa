"""The trainers: decoupled PPO-clip / GRPO updates of a Hugging Face causal LM (``PolicyTrainer``) and
a value model (``CriticTrainer``) under FSDP2, sharing one step skeleton
(``agentrl.trainer._core.TrainerCore``).

Imports only ``agentrl.types``, ``agentrl.errors``, torch and transformers (docs/design.md).
Names are loaded on first use, so ``agentrl.trainer.config`` (no torch) can be imported
by the run configuration without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CriticConfig": "agentrl.trainer.config",
    "KLConfig": "agentrl.trainer.config",
    "OptimConfig": "agentrl.trainer.config",
    "RolloutCorrectionConfig": "agentrl.trainer.config",
    "TrainerConfig": "agentrl.trainer.config",
    "CriticTrainer": "agentrl.trainer.critic_trainer",
    "init_single_process_group": "agentrl.trainer.distributed",
    "LOSS_AGG_MODES": "agentrl.trainer.losses",
    "entropy_from_logits": "agentrl.trainer.losses",
    "kl_penalty": "agentrl.trainer.losses",
    "logprobs_from_logits": "agentrl.trainer.losses",
    "ppo_loss": "agentrl.trainer.losses",
    "rollout_correction": "agentrl.trainer.losses",
    "value_loss_terms": "agentrl.trainer.losses",
    "PolicyTrainer": "agentrl.trainer.trainer",
    "StepResult": "agentrl.trainer.trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
