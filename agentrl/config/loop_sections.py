"""The sections around the rollout and the update: ``controller`` (how they interleave),
``eval`` (held-out evaluation), ``replay`` (the episode store) and ``logging`` (metric
sinks besides metrics.jsonl)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from agentrl.config.base import Section
from agentrl.config.reward_sections import JudgeConfig


class ControllerConfig(Section):
    """How rollout and training interleave (``agentrl.driver.loop`` with
    ``agentrl.driver.sync_source`` or ``agentrl.driver.stream_source``)."""

    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: each iteration rolls out, then trains, then syncs weights; engines idle through the "
                    "update and the trainer through the rollout, and every row is on-policy (staleness 0). "
                    "async: engines keep generating while the trainer updates; each update takes "
                    "env.tasks_per_iteration complete groups from a buffer, trading staleness (at most "
                    "controller.max_staleness policy versions) for throughput.",
    )
    max_staleness: int = Field(
        1,
        description="async only: k, the most policy versions a trained row's oldest token may lag the "
                    "trainer's version (AReaL's bound: at most (k+1) * env.tasks_per_iteration groups admitted "
                    "and not yet trained; a row older than k is dropped and its task re-issued, never trained). "
                    "0 is the synchronous schedule on the streaming engines; larger k keeps engines busier but "
                    "trains on older samples (the decoupled objective corrects for it).",
    )
    partial_rollout: Literal["continue", "drain", "restart"] = Field(
        "continue",
        description="async only: what episodes in flight do at a weight update. continue: in-flight generations "
                    "are preempted and resumed on the new weights (each token keeps the version that sampled it; "
                    "sandboxes stay alive): no wasted tokens, mixed-version turns. drain: in-flight generations "
                    "finish on the old weights before the load (turns never span versions; the load waits for "
                    "the longest generation). restart: in-flight episodes start again from env.reset under the "
                    "new weights (single-version episodes; the work done so far is thrown away).",
    )

    @field_validator("max_staleness")
    @classmethod
    def _max_staleness(cls, k: int) -> int:
        if k < 0:
            raise ValueError(f"got {k}; expected an integer >= 0 (policy versions a trained row may lag the trainer)")
        return k


class EvalConfig(Section):
    """Held-out evaluation (``agentrl eval``, ``agentrl.commands.evaluate``): one fixed sampling
    configuration and token budget, so two evaluations (before / after training) measure the
    same thing. These settings replace the rollout section's for the eval's episodes."""

    split: str = Field("test", description="Task split evaluated (held out: an overlap with the training split is refused unless allowed).")
    engine: Literal["auto", "rollout", "dedicated"] = Field(
        "auto",
        description="Where evaluation during training runs. rollout: on the run's engines between an update and "
                    "the next rollout (controller.mode sync; nothing trains meanwhile). dedicated: on an engine of "
                    "its own (controller.mode async, cluster.placement.eval) that loads the weights of the version "
                    "evaluated and rolls out while training goes on, off the critical path; its results land in the "
                    "metrics line of the first iteration recorded after it finished (eval/policy_version and "
                    "eval/iteration say which). auto: rollout in sync mode, dedicated in async mode.",
    )
    samples: int = Field(4, ge=1, description="Samples per task, n: pass@1..n are reported (Chen et al. 2021's unbiased estimator).")
    num_tasks: int | None = Field(None, ge=1, description="Evaluate the split's first N tasks in its listed order (a cheaper, still fixed subset); None: all of them.")
    seed: int = Field(0, description="Seed of the environments' instances, the sampling and the bootstrap: same seed, same numbers.")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature (top_p 1, top_k off): the policy's own distribution, as pass@k from n samples assumes.")
    max_turns: int = Field(3, ge=1, description="Turn cap per eval episode.")
    max_new_tokens: int = Field(256, ge=1, description="Per-turn completion cap of an eval episode.")
    max_context_tokens: int | None = Field(
        None, ge=16, description="Whole-episode token budget of an eval episode; None (default): the rollout's "
                                 "(rollout.max_context_tokens, 2048 by default), so lowering the rollout's context "
                                 "lowers the eval's with it. Resolved when the config is built.")
    confidence: float = Field(0.95, gt=0.0, lt=1.0, description="Mass of the bootstrap intervals over tasks.")
    num_resamples: int = Field(1000, ge=1, description="Bootstrap resamples of the tasks per interval.")
    allow_overlap: bool = Field(False, description="Evaluate even when the eval tasks overlap the training tasks (refused by default: not held out).")
    every: int = Field(0, ge=0, description="During training: evaluate the policy after every N-th iteration's update, one policy version per eval, with this section's budget, where eval.engine says; metrics eval/* in that iteration's metrics line (async mode: the first line recorded after the eval finished), episodes stored as kind 'eval'. 0: never.")
    before_training: bool = Field(False, description="During training: evaluate the policy the run starts from (version 0) before iteration 1 with this section's budget, where eval.engine says (sync: the run's engines, before the first rollout; async: the dedicated eval engine, beside the first updates); metrics eval_before/* in iteration 1's metrics (async: the first line recorded after it finished), episodes stored as kind 'eval' at iteration 0. A resumed run does not repeat it.")
    after_training: bool = Field(False, description="During training: evaluate the final policy after the last iteration's update, where eval.engine says (as eval.every does; nothing extra when eval.every already evaluates that iteration); metrics eval/* in the last iteration's metrics (async: the last line waits for it).")
    judge: JudgeConfig | None = Field(
        None, description="An LLM judge that scores the eval's episodes (same fields as reward.judge), combined with "
                          "the environment's rule as reward.combine, reward.rule_weight and reward.rule_pass say; "
                          "None: the environment's rule alone (with its declared judge_kwargs). Its own service "
                          "(health-checked at start-up), in agentrl eval and evaluation during training alike. The "
                          "training reward's judge (reward.judge) is allowed here, with a start-up warning: a policy "
                          "trained to please a judge is then measured by it.")
    rubric: dict[str, Any] | None = Field(
        None, description="The rubric eval.judge scores by (as reward.rubric); None: reward.rubric, else the "
                          "environment class's judge_rubric.")

    @property
    def during_training(self) -> bool:
        """Whether the run's own engines evaluate (``every``, ``before_training`` or ``after_training``)."""
        return self.every > 0 or self.before_training or self.after_training


class ReplayConfig(Section):
    url: str | None = Field(None, description="SQLAlchemy URL of the replay store (None: sqlite file replay.db in the run directory).")


class WandbConfig(Section):
    """Weights & Biases (``pip install 'agentrl[wandb]'``): every metrics.jsonl line, under the
    same names, step = iteration (``agentrl.driver.metric_sinks``)."""

    project: str = Field("agentrl", min_length=1, description="W&B project the run is logged to.")
    mode: Literal["offline", "online"] = Field(
        "offline", description="offline: written under RUN_DIR/wandb with no network (upload later with `wandb sync`); "
                               "online: streamed to the W&B server (needs `wandb login`).")
    entity: str | None = Field(None, description="W&B entity (user or team); None: the logged-in user's default.")
    tags: list[str] = Field(default_factory=list, description="Tags of the W&B run, 1-64 characters each (W&B's limit).")

    @field_validator("tags")
    @classmethod
    def _tag_lengths(cls, tags: list[str]) -> list[str]:
        """W&B refuses a tag outside 1-64 characters at ``wandb.init``; here it is a config
        error at load, before Ray or an engine starts."""
        for i, tag in enumerate(tags):
            if not 1 <= len(tag) <= 64:
                raise ValueError(f"logging.wandb.tags[{i}]={tag[:80]!r} has {len(tag)} characters; "
                                 "W&B takes tags of 1-64 characters")
        return tags


class LoggingConfig(Section):
    """Where metrics go besides RUN_DIR/metrics.jsonl and the replay store (optional extras)."""

    tensorboard: bool = Field(False, description="Write every metrics.jsonl line as TensorBoard scalars under RUN_DIR/tensorboard, same names, step = iteration (`pip install 'agentrl[tensorboard]'`).")
    wandb: WandbConfig | None = Field(None, description="Log every metrics.jsonl line to Weights & Biases (see its fields); None: off.")
