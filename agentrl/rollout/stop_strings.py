"""Stop strings: end a turn where its text first holds one of them (``rollout.stop_strings``,
e.g. ``["</tool_call>"]``), so a model that writes a tool call and then goes on to imagine
the tool's output is stopped at its call, the call runs, and the real output comes next.

The engine runs token ids in and out with no tokenizer of its own, so vLLM's stop strings
(which need its detokenizer) are not used. Instead the agent loop's tokenizer decodes:
``VLLMEngine.step`` checks each unfinished request's newest tokens after every engine step
and aborts it as soon as a stop string appears (``finish_reason="stop"``, no stop token),
and the agent loop cuts every finished turn again (``cut_at_stop``), so a stop string
spanning a preemption or a weight load is cut too. The kept ids are the shortest prefix
whose text holds the stop string, so the turn ends with the token that completes it; the
tokens after it were sampled but are not part of the episode (never trained, never shown
to the environment). The next turn's prompt then starts with the chat template's
end-of-message text before its usual glue (``ChatTokenizer.delta_ids(...,
completion_ended_with_stop=False)``): those ids were not sampled and have ``loss_mask`` 0.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["cut_at_stop", "tail_holds_stop"]

Decode = Callable[[Sequence[int]], str]


def _holds(text: str, stop_strings: Sequence[str]) -> bool:
    return any(s in text for s in stop_strings)


def cut_at_stop(ids: Sequence[int], decode: Decode, stop_strings: Sequence[str]) -> int | None:
    """Length of the shortest prefix of ``ids`` whose decoded text holds a stop string.

    Args:
        ids: sampled token ids ``[n]``.
        decode: the policy tokenizer's decode (special tokens kept).
        stop_strings: the strings that end a turn (non-empty strings).

    Returns:
        ``k`` in ``1..n`` (keep ``ids[:k]``), or None when the text holds none of them.
        Holding a stop string is monotone in the prefix length (a prefix's text is a prefix
        of the longer one's, up to an incomplete UTF-8 tail), so ``k`` is found by bisection
        in O(log n) decodes.
    """
    if not stop_strings or not ids or not _holds(decode(list(ids)), stop_strings):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if _holds(decode(list(ids[:mid])), stop_strings):
            hi = mid
        else:
            lo = mid + 1
    return lo


def tail_holds_stop(ids: Sequence[int], decode: Decode, stop_strings: Sequence[str], checked: int) -> bool:
    """Whether the tokens from ``checked`` on (with enough context before them to complete a
    stop string that began earlier) hold a stop string: the engine's per-step check, which
    decodes only the newest tokens instead of the whole completion every step."""
    if not stop_strings or len(ids) <= checked:
        return False
    longest = max(len(s.encode()) for s in stop_strings)  # a token holds at least one byte
    start = max(0, checked - longest)
    return _holds(decode(list(ids[start:])), stop_strings)
