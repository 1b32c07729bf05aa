"""The data contract of agentrl; nothing else defines these records (docs/design.md).

- ``agentrl.types.episode``: ``EpisodeRequest``, ``Episode``, ``TerminationReason``,
  ``PromptMode``, ``broadcast_turn_values``.
- ``agentrl.types.turn``: ``Turn``, ``SamplingRecord``, ``ExecResult``, ``FinishReason``.
- ``agentrl.types.rows``: ``TurnSpan``, ``EpisodeRows`` (an episode's trainer rows).
- ``agentrl.types.batch``: ``TokenSequence``, ``TokenBatch`` (what the trainer sees).
- ``agentrl.types.value``: ``ValueRow``, ``ValueBatch`` (value targets for a critic).
- ``agentrl.types.judge``: ``JudgeRecord`` (a judged episode's audit trail).
- ``agentrl.types.step_info``: ``StepInfo``, ``STEP_INFO_KEYS`` and their helpers.

Import the names from here (``from agentrl.types import Episode``). The package imports
only ``agentrl.errors`` of ours, the standard library, and torch (inside the functions
that build ``TokenBatch`` and ``ValueBatch`` tensors).
"""

from __future__ import annotations

from agentrl.errors import StepInfoError
from agentrl.types.batch import TokenBatch, TokenSequence
from agentrl.types.episode import (
    EPISODE_ID_MAX_LEN,
    Episode,
    EpisodeRequest,
    PromptMode,
    TerminationReason,
    broadcast_turn_values,
)
from agentrl.types.judge import JudgeItem, JudgeRecord
from agentrl.types.rows import EpisodeRows, TurnSpan
from agentrl.types.step_info import (
    EXAMPLE_ROLES,
    OBSERVATION_ROLES,
    STEP_INFO_KEYS,
    ObservationRole,
    StepInfo,
    as_bool,
    tool_function,
    type_name,
)
from agentrl.types.turn import ExecResult, FinishReason, SamplingRecord, Turn
from agentrl.types.value import ValueBatch, ValueRow

__all__ = [
    "EPISODE_ID_MAX_LEN",
    "EXAMPLE_ROLES",
    "OBSERVATION_ROLES",
    "STEP_INFO_KEYS",
    "Episode",
    "EpisodeRequest",
    "EpisodeRows",
    "ExecResult",
    "FinishReason",
    "JudgeItem",
    "JudgeRecord",
    "ObservationRole",
    "PromptMode",
    "SamplingRecord",
    "StepInfo",
    "StepInfoError",
    "TerminationReason",
    "TokenBatch",
    "TokenSequence",
    "Turn",
    "TurnSpan",
    "ValueBatch",
    "ValueRow",
    "as_bool",
    "broadcast_turn_values",
    "tool_function",
    "type_name",
]
