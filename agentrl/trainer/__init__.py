"""Policy trainer: PPO-clip / GRPO updates of a Hugging Face causal LM under FSDP2.

Imports only ``agentrl.types``, ``agentrl.errors``, torch and transformers (design.md).
"""

from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.critic_trainer import CriticConfig, CriticTrainer
from agentrl.trainer.distributed import init_single_process_group
from agentrl.trainer.losses import (
    LOSS_AGG_MODES,
    entropy_from_logits,
    logprobs_from_logits,
    policy_loss,
)
from agentrl.trainer.trainer import PolicyTrainer

__all__ = [
    "CriticConfig",
    "CriticTrainer",
    "LOSS_AGG_MODES",
    "PolicyTrainer",
    "TrainerConfig",
    "entropy_from_logits",
    "init_single_process_group",
    "logprobs_from_logits",
    "policy_loss",
]
