"""One agent turn as the engine and the environment produced it: ``Turn``, with the
sampling transform behind its log-probs (``SamplingRecord``), how its completion ended
(``FinishReason``) and the sandbox commands its action ran (``ExecResult``).

A turn's tokens are ``prompt_ids`` (``loss_mask`` 0) followed by ``completion_ids``
(``loss_mask`` 1), with one ``behavior_log_probs`` entry (float, nats) and one
``policy_versions`` entry (int) per completion id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Literal

from agentrl.errors import ContractError

FinishReason = Literal["stop", "length", "abort"]
"""How a completion ended: a stop id or stop string, ``max_new_tokens``, or an aborted request."""


@dataclass(frozen=True)
class SamplingRecord:
    """The sampling transform that produced ``behavior_log_probs``.

    The trainer recomputes log-probs under the same transform (docs/design.md, invariant 4):
    ``log_softmax(logits / temperature)``. ``top_p < 1`` or ``top_k > 0`` change the
    sampling distribution; the trainer refuses them rather than silently mis-scoring.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


@dataclass(frozen=True)
class ExecResult:
    """Result of one command run in a sandbox.

    Attributes:
        command: argv list or shell string as given.
        exit_code: process exit status; ``-9``/``137`` style values when killed. ``None``
            only when the command never started.
        stdout, stderr: decoded output (invalid UTF-8 replaced by U+FFFD, never raising),
            capped at the sandbox's output cap; ``truncated_bytes`` counts what was cut.
        duration_s: wall time in seconds.
        timed_out: the command was killed at its ``timeout_s``.
        truncated_bytes: bytes dropped from stdout+stderr by the output cap.
    """

    command: str | tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated_bytes: int = 0


@dataclass
class Turn:
    """One agent turn: the tokens appended before the completion, then the completion.

    Attributes:
        prompt_ids: ids appended since the previous completion of the turn's branch: the
            initial prompt (the branch's first turn) or the observation plus chat-template
            glue. ``loss_mask`` 0.
        completion_ids: ids exactly as the engine sampled them, the stop token included
            when the engine emitted one. ``loss_mask`` 1.
        behavior_log_probs: log-prob (nats) of each completion id under the engine's
            sampling distribution (``sampling`` transform applied). ``len ==
            len(completion_ids)``.
        sampling: the transform used (temperature, top_p, top_k).
        policy_version: weight version that sampled the turn's first token (0 = initial
            weights); ``== min(policy_versions)``.
        policy_versions: ``[len(completion_ids)]`` the weight version that sampled each
            completion id (docs/design.md: a turn spans versions when a rollout continues across
            a weight update); never decreasing. Left empty when built by hand, it is filled
            with ``policy_version`` for every completion id.
        finish_reason: ``stop`` (a stop id or stop string), ``length`` (max new tokens)
            or ``abort``.
        reward: environment reward after this turn's action; ``None`` until known or when
            the reward failed (see ``Episode.error``).
        anchor: hashable state key *before* this turn's action, for GiGPO
            (``info["anchor"]`` or else the observation text).
        action_text: decoded completion (for humans, parsers and the replay viewer).
        observation_text: the environment's observation after the action ("" if none).
        invalid_action: the completion could not be parsed into a valid action
            (the model's fault; it may be penalised).
        exec_results: sandbox commands run while executing this turn's action.
        branch: the branch of the episode this turn extends (``full_history`` mode; 0 unless
            the environment forked the conversation, ``StepInfo.branch``). Each branch is its
            own token stream and trainer row (``Episode.rows``); the first turn of a branch
            > 0 holds that branch's whole rendered prompt as ``prompt_ids``. ``>= 0``.
        tool_calls: how many tool calls this turn's action made, as the environment reports
            (``StepInfo.tool_calls`` of the step that ran it); 0 when it does not say. ``>= 0``.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    behavior_log_probs: list[float]
    sampling: SamplingRecord = field(default_factory=SamplingRecord)
    policy_version: int = 0
    finish_reason: FinishReason = "stop"
    reward: float | None = None
    anchor: Hashable = ""
    action_text: str = ""
    observation_text: str = ""
    invalid_action: bool = False
    exec_results: list[ExecResult] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    branch: int = 0
    tool_calls: int = 0

    def __post_init__(self) -> None:
        if not self.policy_versions and self.completion_ids:
            self.policy_versions = [int(self.policy_version)] * len(self.completion_ids)

    def validate(self) -> None:
        """Raise ``ContractError`` if this turn breaks the token contract."""
        if len(self.completion_ids) != len(self.behavior_log_probs):
            raise ContractError(
                f"turn has {len(self.completion_ids)} completion ids but "
                f"{len(self.behavior_log_probs)} behavior_log_probs; expected equal counts"
            )
        if len(self.policy_versions) != len(self.completion_ids):
            raise ContractError(
                f"turn has {len(self.completion_ids)} completion ids but {len(self.policy_versions)} "
                "policy_versions; expected one version per sampled id"
            )
        if any(b < a for a, b in zip(self.policy_versions, self.policy_versions[1:])):
            raise ContractError(f"turn policy_versions={self.policy_versions[:20]} decrease; a later token "
                                "cannot come from older weights")
        if self.policy_versions and self.policy_versions[0] != self.policy_version:
            raise ContractError(f"turn policy_version={self.policy_version} but its first token's version is "
                                f"{self.policy_versions[0]}; expected the version of the first sampled token")
        for lp in self.behavior_log_probs:
            if not (math.isfinite(lp) and lp <= 1e-4):
                raise ContractError(
                    f"behavior_log_prob={lp!r} is not a finite log-probability (<= 0)"
                )
        if self.finish_reason not in ("stop", "length", "abort"):
            raise ContractError(
                f"finish_reason={self.finish_reason!r}; expected 'stop', 'length' or 'abort'"
            )
        for name in ("branch", "tool_calls"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ContractError(f"turn {name}={value!r}; expected an int >= 0")
        try:
            hash(self.anchor)
        except TypeError as exc:
            raise ContractError(f"anchor={self.anchor!r} is not hashable") from exc
