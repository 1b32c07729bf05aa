"""Stop strings: end a turn where its text first holds one of them (``rollout.stop_strings``,
e.g. ``["</tool_call>"]``), so a model that writes a tool call and then goes on to imagine
the tool's output is stopped at its call, the call runs, and the real output comes next.

Not inside a tool call's JSON string: a stop string whose first character lies inside a
string of the JSON object of an open Hermes tool call (``<tool_call>{...}``, the format
``environments.tools.HermesToolParser`` reads) does not end the turn, so a call such as
``<tool_call>{"name": "bash", "arguments": {"command": "grep -n '</tool_call>' notes.md"}}
</tool_call>`` is sampled whole and ends at its real closing tag. The string state is read
as JSON does (``"`` opens and closes a string inside the object, ``\\`` escapes the next
character); the closing tag outside a string ends the call at any depth, so a call with
unbalanced braces still stops there. This holds for every stop string, not only the
closing tag, and in every place a stop string is looked for (``first_stop_end``).

The engine runs token ids in and out with no tokenizer of its own, so vLLM's stop strings
(which need its detokenizer, and know no JSON state) are not used. Instead the agent
loop's tokenizer decodes: ``VLLMEngine.step`` checks each unfinished request's newest
tokens after every engine step and aborts it as soon as a stop string ends the turn
(``finish_reason="stop"``, no stop token), and the agent loop cuts every finished turn
again (``cut_at_stop``), so a stop string spanning a preemption or a weight load is cut
too. A request that continues a turn after a preemption carries the turn's ids sampled so
far (``VLLMEngine.add(..., stop_context_ids=...)``), so the string state of the whole turn
is known. The kept ids are the shortest prefix whose text holds a stop string that ends
the turn, so the turn ends with the token that completes it; the tokens after it were
sampled but are not part of the episode (never trained, never shown to the environment).
The next turn's prompt then starts with the chat template's end-of-message text before
its usual glue (``ChatTokenizer.delta_ids(..., completion_ended_with_stop=False)``): those
ids were not sampled and have ``loss_mask`` 0.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["TOOL_CALL_OPEN", "TOOL_CALL_CLOSE", "cut_at_stop", "first_stop_end", "in_tool_call_string",
           "tail_holds_stop"]

Decode = Callable[[Sequence[int]], str]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def in_tool_call_string(text: str) -> bytearray:
    """Per character of ``text``: 1 where it lies inside a JSON string of an open tool call.

    A tool call opens at ``<tool_call>`` (outside any string) and closes at ``</tool_call>``
    outside a string. Inside it, ``{`` / ``[`` and ``}`` / ``]`` outside strings count the
    JSON depth; a ``"`` at depth >= 1 opens a string, the next unescaped ``"`` closes it
    (both quotes are outside: 0), and ``\\`` escapes the next character. A new
    ``<tool_call>`` outside a string starts a new call.

    Args:
        text: decoded completion text.

    Returns:
        ``[len(text)]`` bytes, 1 inside a tool call's JSON string, else 0.
    """
    n = len(text)
    mask = bytearray(n)
    in_call = in_str = escaped = False
    depth = 0
    i = 0
    while i < n:
        c = text[i]
        if in_str:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_str = False
                i += 1
                continue
            mask[i] = 1
            i += 1
            continue
        if c == "<" and text.startswith(TOOL_CALL_OPEN, i):
            in_call, depth = True, 0
            i += len(TOOL_CALL_OPEN)
            continue
        if in_call:
            if c == "<" and text.startswith(TOOL_CALL_CLOSE, i):
                in_call = False
                i += len(TOOL_CALL_CLOSE)
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth = max(0, depth - 1)
            elif c == '"' and depth > 0:
                in_str = True
        i += 1
    return mask


def first_stop_end(text: str, stop_strings: Sequence[str]) -> int | None:
    """End index (exclusive) in ``text`` of the first stop string that ends the turn: the
    occurrence, of any of ``stop_strings``, that ends first among those whose first
    character is not inside a tool call's JSON string (``in_tool_call_string``).

    Args:
        text: decoded completion text.
        stop_strings: non-empty strings.

    Returns:
        ``e`` with ``text[:e]`` ending with that stop string, or None when none ends the turn.
    """
    if not any(s in text for s in stop_strings):
        return None
    mask: bytearray | None = None
    best: int | None = None
    for s in stop_strings:
        j = text.find(s)
        while j >= 0 and (best is None or j + len(s) < best):
            if mask is None:
                mask = in_tool_call_string(text)
            if not mask[j]:
                best = j + len(s)
                break
            j = text.find(s, j + 1)
    return best


def _holds(text: str, stop_strings: Sequence[str]) -> bool:
    return first_stop_end(text, stop_strings) is not None


def cut_at_stop(ids: Sequence[int], decode: Decode, stop_strings: Sequence[str]) -> int | None:
    """Length of the shortest prefix of ``ids`` whose decoded text holds a stop string that
    ends the turn (``first_stop_end``: not one inside a tool call's JSON string).

    Args:
        ids: sampled token ids ``[n]``.
        decode: the policy tokenizer's decode (special tokens kept).
        stop_strings: the strings that end a turn (non-empty strings).

    Returns:
        ``k`` in ``1..n`` (keep ``ids[:k]``), or None when the text holds none of them.
        Holding such a stop string is monotone in the prefix length (a prefix's text is a
        prefix of the longer one's, up to an incomplete UTF-8 tail, and whether a position
        is inside a JSON string depends on the text before it only), so ``k`` is found by
        bisection in O(log n) decodes.
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
    stop string that began earlier) hold a stop string, wherever it lies: the engine's
    cheap per-step test, which decodes only the newest tokens instead of the whole
    completion every step. True is only a candidate: whether that stop string ends the turn
    (it may lie inside a tool call's JSON string) takes the whole text (``cut_at_stop``)."""
    if not stop_strings or len(ids) <= checked:
        return False
    longest = max(len(s.encode()) for s in stop_strings)  # a token holds at least one byte
    start = max(0, checked - longest)
    text = decode(list(ids[start:]))
    return any(s in text for s in stop_strings)
