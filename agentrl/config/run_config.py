"""``Config``, the whole run configuration, with the checks that span sections, and
``trainer_configs``, the one place the trainers' dataclasses are built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

import agentrl.trainer.config as _tc
from agentrl.config.base import Section
from agentrl.config.loop_sections import (
    ControllerConfig,
    EvalConfig,
    LoggingConfig,
    ReplayConfig,
)
from agentrl.config.placement import ClusterConfig
from agentrl.config.reward_sections import RewardConfig
from agentrl.config.sections import (
    AlgorithmConfig,
    EnvConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    SandboxConfig,
)
from agentrl.config.trainer_sections import (
    CriticSection,
    TrainerSection,
    as_value_error,
    build_critic_config,
    build_trainer_config,
    check_reference_vocab,
)
from agentrl.config.user_modules import import_user_modules


class Config(Section):
    """The whole run configuration: one field per section. Built by ``config_from_dict``,
    ``load_config`` or ``load_default_config``; its cross-checks (values of one section
    that another constrains) run after the sections validate."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    critic: CriticSection = Field(default_factory=CriticSection)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="before")
    @classmethod
    def _import_user_modules(cls, data: Any) -> Any:
        """Import ``env.import_modules`` before the sections validate, so the
        environments and estimators they register are known here (``algorithm.advantage``
        is checked against the estimator registry) and in every process that builds the
        config from its dict (the Ray actors)."""
        import_user_modules(data)
        return data


    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        if self.eval.max_context_tokens is None:  # the rollout's (EvalConfig.max_context_tokens)
            self.eval.max_context_tokens = self.rollout.max_context_tokens
        rc = self.trainer.rollout_correction
        if (rc.is_level is not None or rc.token_mask_band is not None or rc.seq_mask_band is not None) and (
            self.rollout.top_p < 1.0 or self.rollout.top_k > 0
        ):
            raise ValueError(
                f"trainer.rollout_correction (is_level={rc.is_level!r}, token_mask_band={rc.token_mask_band}, "
                f"seq_mask_band={rc.seq_mask_band}) with rollout.top_p={self.rollout.top_p}, "
                f"rollout.top_k={self.rollout.top_k}: importance weights compare the engine's log-probs with the "
                "trainer's, which cannot reproduce top-p/top-k truncation; use top_p=1.0 and top_k=-1, or turn "
                "the correction off"
            )
        if self.rollout.top_p < 1.0 or self.rollout.top_k > 0:
            raise ValueError(
                f"rollout.top_p={self.rollout.top_p}, rollout.top_k={self.rollout.top_k}: the trainer cannot "
                "recompute log-probs under top-p/top-k truncation; use top_p=1.0 and top_k=-1"
            )
        if self.algorithm.overlong_buffer_tokens > self.rollout.max_new_tokens:
            raise ValueError(
                f"algorithm.overlong_buffer_tokens={self.algorithm.overlong_buffer_tokens} must not exceed "
                f"rollout.max_new_tokens={self.rollout.max_new_tokens}"
            )
        if self.controller.mode == "async":
            slots = self.rollout.num_engines * self.rollout.max_num_seqs
            if self.env.group_size > slots:
                raise ValueError(
                    f"controller.mode='async' with env.group_size={self.env.group_size} larger than "
                    f"rollout.num_engines * rollout.max_num_seqs = {self.rollout.num_engines} * "
                    f"{self.rollout.max_num_seqs} = {slots}: the engines cannot hold one group at once, so its "
                    f"members run one after another while the group ages toward controller.max_staleness="
                    f"{self.controller.max_staleness} and every update waits for it; use a smaller group or "
                    "more engines / sequences"
                )
        if self.eval.during_training:
            _check_eval_engine(self)
        if self.eval.during_training and self.eval_engine == "rollout" and \
                self.eval.max_context_tokens > self.rollout.max_context_tokens:
            raise ValueError(f"eval.max_context_tokens={self.eval.max_context_tokens} exceeds rollout.max_context_tokens="
                             f"{self.rollout.max_context_tokens}: evaluation during training runs on the run's engines, "
                             "whose context is the rollout's; lower eval.max_context_tokens or raise the rollout's")
        if self.trainer.device == "cpu" and self.trainer.backend == "nccl":
            raise ValueError("trainer.backend='nccl' needs trainer.device='cuda'")
        t = self.trainer
        if t.attn_implementation == "flash_attention_2" and (t.device != "cuda" or self.model.dtype != "bfloat16"):
            raise ValueError(
                f"trainer.attn_implementation='flash_attention_2' with trainer.device={t.device!r}, "
                f"model.dtype={self.model.dtype!r}: flash attention needs device 'cuda' and dtype 'bfloat16' "
                "(it has no CPU or fp32 kernel); use attn_implementation 'auto', which picks it where it can run"
            )
        # The trainers' own checks (one place: agentrl.trainer.config), on what
        # trainer_configs will build; the model folder is only known once prepared.
        as_value_error(lambda: _policy_config(self, "<model.path>").validate(), "trainer.")
        as_value_error(lambda: _critic_config(self, "<model.path>").validate(), "critic.")
        return self

    def run_dir(self) -> Path:
        return Path(self.run.dir) if self.run.dir else Path(self.run.output_dir) / self.run.name

    @property
    def eval_engine(self) -> str:
        """``eval.engine`` resolved: ``"rollout"`` or ``"dedicated"`` (``auto``: by ``controller.mode``)."""
        if self.eval.engine != "auto":
            return self.eval.engine
        return "dedicated" if self.controller.mode == "async" else "rollout"


def _check_eval_engine(cfg: Config) -> None:
    """Evaluation during training fits the controller mode (``eval.engine``); raises
    ``ValueError`` naming the values otherwise (the config's cross-checks)."""
    ev, mode = cfg.eval, cfg.controller.mode
    on = ", ".join([f"eval.every={ev.every}"] * (ev.every > 0) + ["eval.before_training=true"] * ev.before_training
                   + ["eval.after_training=true"] * ev.after_training)  # what asked for evaluation during training
    if mode == "async" and ev.engine == "rollout":
        raise ValueError(f"eval.engine='rollout' with controller.mode='async' ({on}): the rollout "
                         "engines load new weights after every update and an episode may span versions, so an eval "
                         "on them would not measure one policy version; use eval.engine=dedicated (or auto)")
    if mode == "sync" and ev.engine == "dedicated":
        raise ValueError(f"eval.engine='dedicated' with controller.mode='sync' ({on}): a dedicated "
                         "eval engine runs beside asynchronous training only; sync mode evaluates on the run's "
                         "engines between updates (eval.engine=auto or rollout)")


def _policy_config(cfg: Config, model_path: str) -> _tc.TrainerConfig:
    """``cfg``'s ``TrainerConfig`` for the policy at ``model_path``."""
    return build_trainer_config(cfg.trainer, model_path=model_path, dtype=cfg.model.dtype, seed=cfg.run.seed)


def _critic_config(cfg: Config, model_path: str) -> _tc.CriticConfig:
    """``cfg``'s ``CriticConfig``, its backbone ``critic.model_path`` or else ``model_path``."""
    return build_critic_config(cfg.critic, model_path=model_path, dtype=cfg.model.dtype,
                               device=cfg.trainer.device, seed=cfg.run.seed)


def trainer_configs(cfg: Config, model_path: str) -> tuple[_tc.TrainerConfig, _tc.CriticConfig | None]:
    """The one place the trainers' dataclasses are built from the run config.

    Every ``trainer`` field except ``num_ranks`` / ``backend`` and every ``critic`` field
    except ``model_path`` becomes the dataclass field of the same name (the sub-sections
    ``trainer.rollout_correction`` and ``trainer.kl`` as ``RolloutCorrectionConfig`` and
    ``KLConfig``).

    Args:
        cfg: the validated run config.
        model_path: the policy's prepared model folder (``model.path`` resolved); also
            the critic's backbone unless ``critic.model_path`` is set.

    Returns:
        ``(TrainerConfig, CriticConfig | None)`` from ``agentrl.trainer.config``: dtype
        from ``model.dtype``, device from ``trainer.device`` and seed from ``run.seed``
        for both; the critic's is ``None`` unless ``algorithm.uses_critic``.

    Raises:
        ConfigError: ``trainer.kl.reference_path`` set to a folder whose vocabulary
            differs from the policy's (``check_reference_vocab``).
    """
    policy = _policy_config(cfg, model_path)
    if cfg.trainer.kl.reference_path is not None:
        check_reference_vocab(model_path, cfg.trainer.kl.reference_path)
    critic = None
    if cfg.algorithm.uses_critic:  # turn_critic or gae: the same value model and trainer
        critic = _critic_config(cfg, model_path)
    return policy, critic
