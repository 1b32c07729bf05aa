"""Stand-ins for the fields of vLLM's ``CompletionOutput`` that ``VLLMEngine`` reads, and an
engine built without vLLM for its stop-string bookkeeping only. The stop-string tests use
them beside the real-engine tests in tests/integration/rollout/test_stop_in_tool_call_string.py."""

from __future__ import annotations

from typing import Callable, Sequence


class FakeLogprob:
    def __init__(self, lp: float) -> None:
        self.logprob = lp


class FakeOutput:
    """The fields of vLLM's CompletionOutput that the engine reads."""

    def __init__(self, ids: Sequence[int], finish_reason: str | None = None) -> None:
        self.token_ids = list(ids)
        self.logprobs = [{t: FakeLogprob(-0.5)} for t in ids]
        self.finish_reason = finish_reason


def stop_bookkeeping_engine(decode: Callable[[Sequence[int]], str]):
    """A ``VLLMEngine`` with only its stop-string state (no vLLM behind it)."""
    from agentrl.rollout.engine import VLLMEngine

    eng = object.__new__(VLLMEngine)
    eng.decode = decode
    eng._stops = {}
    return eng
