"""One error root for agentrl, with subclasses that say whose fault a failure is.

The split matters for training: a *model* fault (unparseable tool call, answer cut by
``max_tokens``) is part of the episode and may be penalised; an *infrastructure* fault
(sandbox died, engine crashed) or a *reward* fault (verifier raised) is never scored as a
model failure — the episode is flagged, excluded from the loss and counted.

This module imports nothing of ours (docs/design.md, "Who may import whom").
"""

from __future__ import annotations


class AgentRLError(Exception):
    """Root of every error agentrl raises on purpose."""


class ConfigError(AgentRLError, ValueError):
    """A configuration value is invalid. The message names the key, the value and what
    was expected, e.g. ``group_size=3 must divide batch_size=8``."""


class ContractError(AgentRLError, ValueError):
    """Data broke the contract of ``agentrl.types`` (e.g. ``sum(loss_mask)`` differs from
    ``len(behavior_log_probs)``). Always a bug in the producer, never the model's fault."""


class StepInfoError(ContractError):
    """An environment's ``info`` broke the step-info contract (``agentrl.types.StepInfo``).
    ``env_id``, ``key`` and ``value`` name what was wrong; the message also says what was
    expected."""

    def __init__(self, message: str, *, env_id: str, key: str, value: object) -> None:
        super().__init__(message)
        self.env_id = env_id
        self.key = key
        self.value = value


class EnvError(AgentRLError):
    """An environment returned something the contract does not allow (wrong types,
    step after the episode ended, unhashable anchor)."""


class TemplateError(ConfigError):
    """The chat template cannot be extended turn by turn (delta tokenization would not
    reproduce the full rendering). Raised at start-up, never mid-run."""


class InfraError(AgentRLError):
    """Infrastructure failed (sandbox, engine, daemon, network). Never the model's fault:
    the episode is recorded with termination reason ``infra_error``."""


class SandboxError(InfraError):
    """The sandbox failed to start, died, or its backend went away. Carries the command
    and whatever output was captured, when there was a command."""

    def __init__(self, message: str, *, command: object = None, output: str = "") -> None:
        super().__init__(message)
        self.command = command
        self.output = output


class EngineError(InfraError):
    """The inference engine failed (crash, bad output shape)."""


class ClusterError(InfraError):
    """A Ray node, actor or rendezvous fault (node lost, actor killed by the memory
    monitor, trainer ranks that never met). Infrastructure, never a model failure: the
    message names the actor and the node, and the last checkpoint stays intact."""


class RewardError(AgentRLError):
    """A reward function raised, timed out, or returned a malformed value. The sample is
    flagged ``reward_error`` and excluded from the loss; it is never scored 0."""


class JudgeError(RewardError):
    """A judge (a local judge pool or an OpenAI-compatible endpoint) did not answer after its
    retries, or answered what its rubric cannot parse. The episode is flagged
    ``reward_error`` and excluded from the loss, never scored 0; at start-up, the run stops
    with it (the health check)."""


class ModelOutputError(AgentRLError):
    """The policy produced output that cannot be acted upon. This *is* the model's fault."""


class ToolParseError(ModelOutputError):
    """A tool call in the completion is malformed (bad JSON, unknown tool, bad arguments)."""


class CheckpointError(AgentRLError):
    """A checkpoint is missing, incomplete, or does not match the configuration."""
