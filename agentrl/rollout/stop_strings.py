"""Stop strings: end a turn where its text first holds one of them (``rollout.stop_strings``,
e.g. ``["</tool_call>"]``), so a model that writes a tool call and then goes on to imagine
the tool's output is stopped at its call, the call runs, and the real output comes next.

Which occurrences end a turn (``first_stop_end``), read with the Hermes tool-call format
(``<tool_call>{...}</tool_call>``, what ``environments.tools.HermesToolParser`` reads):

* the closing tag ``</tool_call>`` ends a turn only where it closes an open call: after a
  ``<tool_call>`` and outside the JSON strings of its object. One inside a string, as in
  ``<tool_call>{"name": "bash", "arguments": {"command": "grep -n '</tool_call>' notes.md"}}
  </tool_call>``, is part of the argument; one outside any call, in prose or reasoning before
  the call ("I'll grep for the literal `</tool_call>` tag."), is text, and the call after it
  is sampled whole. The closing tag outside a string closes the call at any depth, so a call
  with unbalanced braces still stops there;
* any other stop string ends a turn where its first character is not inside a JSON string of
  an open call.

The string state is read as JSON does (``"`` opens and closes a string inside the object,
``\\`` escapes the next character; ``ToolCallScanner``).

A turn that ran to its token limit (``finish_reason`` ``length``) with no stop under these
rules but with a stop string inside a JSON string of an open call is cut at the first such
one and ends there as stopped (``cut_at_stop_in_string``, applied by the agent loop): a call
whose closing quote is missing (``"command": "cat notes.md}}</tool_call>``) reads its closing
tag as part of the string and would otherwise run on into imagined tool output; cut there, it
is parsed and scored as an invalid call, as a model's format error, not as a cut reply.

The engine runs token ids in and out with no tokenizer of its own, so vLLM's stop strings
(which need its detokenizer, and know no JSON state) are not used. Instead the agent
loop's tokenizer decodes: ``VLLMEngine.step`` feeds each unfinished request's newest text to
its ``StopWatch`` after every engine step (the string state is kept, so a step costs the new
text's length, not the turn's) and aborts the request as soon as a stop string ends the turn
(``finish_reason="stop"``, no stop token), cut exactly by ``cut_at_stop``; the agent loop cuts
every finished turn again, so a stop string spanning a preemption or a weight load is cut
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

__all__ = ["TOOL_CALL_OPEN", "TOOL_CALL_CLOSE", "StopCheck", "StopWatch", "ToolCallScanner", "cut_at_stop",
           "cut_at_stop_in_string", "first_stop_end", "in_tool_call_string"]

Decode = Callable[[Sequence[int]], str]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

IN_STRING = 1  # flag: the character lies inside a JSON string of an open tool call
IN_CALL = 2  # flag: the character lies in an open tool call, outside its JSON strings
_TAGS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)


class ToolCallScanner:
    """The tool-call string state of a text read in pieces, as if read whole.

    A tool call opens at ``<tool_call>`` (outside any string) and closes at ``</tool_call>``
    outside a string. Inside it, ``{`` / ``[`` and ``}`` / ``]`` outside strings count the
    JSON depth; a ``"`` at depth >= 1 opens a string, the next unescaped ``"`` closes it
    (both quotes are outside), and ``\\`` escapes the next character. A new ``<tool_call>``
    outside a string starts a new call. A ``</tool_call>`` outside any call changes nothing.

    ``feed`` reads each new piece once (its cost is the piece's length, not the text's): a
    tail that may be the start of a tag (``<tool`` outside a string) waits for the next
    piece (``held``); ``feed(..., final=True)`` reads it as it is.

    Attributes:
        in_call, in_str, escaped, depth: the state after the ``pos`` characters read.
        pos: characters read (the text fed so far, less ``held``).
        flags: per character read from ``flags_base`` on: ``IN_STRING`` (inside a JSON
            string of an open call) and/or ``IN_CALL`` (in an open call, outside a string);
            the characters of a tag have the flags of its ``<``. ``trim`` drops old ones.
    """

    __slots__ = ("in_call", "in_str", "escaped", "depth", "pos", "held", "flags", "flags_base")

    def __init__(self) -> None:
        self.in_call = self.in_str = self.escaped = False
        self.depth = 0
        self.pos = 0
        self.held = ""
        self.flags = bytearray()
        self.flags_base = 0

    def state(self) -> tuple[bool, bool, bool, int, int]:
        """``(in_call, in_str, escaped, depth, pos)``."""
        return self.in_call, self.in_str, self.escaped, self.depth, self.pos

    def trim(self, keep_from: int) -> None:
        """Forget the flags of the characters before index ``keep_from`` of the text."""
        drop = min(max(0, keep_from - self.flags_base), len(self.flags))
        if drop:
            del self.flags[:drop]
            self.flags_base += drop

    def feed(self, piece: str, *, final: bool = False) -> None:
        """Read ``piece``, the next characters of the text."""
        text = self.held + piece if self.held else piece
        self.held = ""
        n = len(text)
        flags = self.flags
        in_call, in_str, escaped, depth = self.in_call, self.in_str, self.escaped, self.depth
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
                    flags.append(IN_CALL)
                    i += 1
                    continue
                flags.append(IN_STRING)
                i += 1
                continue
            f = IN_CALL if in_call else 0
            if c == "<":
                if text.startswith(TOOL_CALL_OPEN, i):
                    flags.extend(bytes((f,)) * len(TOOL_CALL_OPEN))
                    in_call, depth = True, 0
                    i += len(TOOL_CALL_OPEN)
                    continue
                if in_call and text.startswith(TOOL_CALL_CLOSE, i):
                    flags.extend(bytes((f,)) * len(TOOL_CALL_CLOSE))
                    in_call = False
                    i += len(TOOL_CALL_CLOSE)
                    continue
                rest = text[i:]
                if not final and any(len(rest) < len(t) and t.startswith(rest) for t in _TAGS):
                    self.held = rest
                    break
            if in_call:
                if c in "{[":
                    depth += 1
                elif c in "}]":
                    depth = max(0, depth - 1)
                elif c == '"' and depth > 0:
                    in_str = True
            flags.append(f)
            i += 1
        self.in_call, self.in_str, self.escaped, self.depth = in_call, in_str, escaped, depth
        self.pos += i


def _flags(text: str) -> bytearray:
    scanner = ToolCallScanner()
    scanner.feed(text, final=True)
    return scanner.flags


def in_tool_call_string(text: str) -> bytearray:
    """Per character of ``text``: 1 where it lies inside a JSON string of an open tool call
    (``ToolCallScanner``), else 0.

    Args:
        text: decoded completion text.

    Returns:
        ``[len(text)]`` bytes, 1 inside a tool call's JSON string, else 0.
    """
    return _flags(text).translate(_STRING_BIT)


_STRING_BIT = bytes((f & IN_STRING) for f in range(256))


def _ends_turn(stop: str, flag: int) -> bool:
    """Whether ``stop`` beginning at a character with ``flag`` ends the turn: the closing
    tag where it closes an open call, any other stop string outside a call's JSON strings."""
    if stop == TOOL_CALL_CLOSE:
        return bool(flag & IN_CALL)
    return not flag & IN_STRING


def _first_end(text: str, stop_strings: Sequence[str], accept: Callable[[str, int], bool]) -> int | None:
    if not any(s in text for s in stop_strings):
        return None
    flags: bytearray | None = None
    best: int | None = None
    for s in stop_strings:
        j = text.find(s)
        while j >= 0 and (best is None or j + len(s) < best):
            if flags is None:
                flags = _flags(text)
            if accept(s, flags[j]):
                best = j + len(s)
                break
            j = text.find(s, j + 1)
    return best


def first_stop_end(text: str, stop_strings: Sequence[str]) -> int | None:
    """End index (exclusive) in ``text`` of the first stop string that ends the turn: the
    occurrence, of any of ``stop_strings``, that ends first among those that end a turn
    (the closing tag ``</tool_call>`` where it closes an open call; any other stop string
    where its first character is not inside a tool call's JSON string).

    Args:
        text: decoded completion text.
        stop_strings: non-empty strings.

    Returns:
        ``e`` with ``text[:e]`` ending with that stop string, or None when none ends the turn.
    """
    return _first_end(text, stop_strings, _ends_turn)


def _cut(ids: Sequence[int], decode: Decode, holds: Callable[[str], bool]) -> int | None:
    if not ids or not holds(decode(list(ids))):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(decode(list(ids[:mid]))):
            hi = mid
        else:
            lo = mid + 1
    return lo


def cut_at_stop(ids: Sequence[int], decode: Decode, stop_strings: Sequence[str]) -> int | None:
    """Length of the shortest prefix of ``ids`` whose decoded text holds a stop string that
    ends the turn (``first_stop_end``).

    Args:
        ids: sampled token ids ``[n]``.
        decode: the policy tokenizer's decode (special tokens kept).
        stop_strings: the strings that end a turn (non-empty strings).

    Returns:
        ``k`` in ``1..n`` (keep ``ids[:k]``), or None when the text holds none of them.
        Holding such a stop string is monotone in the prefix length (a prefix's text is a
        prefix of the longer one's, up to an incomplete UTF-8 tail, and the state at a
        position depends on the text before it only), so ``k`` is found by bisection in
        O(log n) decodes.
    """
    if not stop_strings:
        return None
    return _cut(ids, decode, lambda text: first_stop_end(text, stop_strings) is not None)


def cut_at_stop_in_string(ids: Sequence[int], decode: Decode, stop_strings: Sequence[str]) -> int | None:
    """Length of the shortest prefix of ``ids`` whose decoded text holds a stop string that
    begins inside a JSON string of an open tool call: the cut of a turn that ran to its
    token limit without a stop (``agentrl.rollout.loop``), where such a string is most likely
    the call's end after a missing closing quote (``"command": "cat notes.md}}</tool_call>``).

    Returns:
        ``k`` in ``1..n``, or None when no stop string lies in such a string.
    """
    if not stop_strings:
        return None

    def in_string(stop: str, flag: int) -> bool:
        return bool(flag & IN_STRING)

    return _cut(ids, decode, lambda text: _first_end(text, stop_strings, in_string) is not None)


class StopWatch:
    """The engine's per-step stop check of one request: fed the turn's text piece by piece,
    it says where the first stop string that ends the turn ends, at a cost of the piece's
    length plus the longest stop string, whatever the turn's length (the string state is
    kept in a ``ToolCallScanner``). Equal to ``first_stop_end`` on the text fed so far.

    Args:
        stop_strings: non-empty strings.
    """

    __slots__ = ("stops", "longest", "scanner", "window", "base")

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self.stops = tuple(stop_strings)
        self.longest = max(len(s) for s in self.stops)
        self.scanner = ToolCallScanner()
        self.window = ""  # the text's last characters, from index ``base`` on
        self.base = 0

    def feed(self, piece: str, *, final: bool = False) -> int | None:
        """Read the next ``piece`` of the text; the end index (exclusive, in the whole text)
        of the first stop string that ends the turn among those that end in ``piece``, or
        None."""
        old_end = self.base + len(self.window)
        self.window += piece
        sc = self.scanner
        sc.feed(piece, final=final)
        best: int | None = None
        for s in self.stops:
            j = self.window.find(s, max(0, old_end - len(s) + 1 - self.base))
            while j >= 0 and (best is None or self.base + j + len(s) < best):
                a = self.base + j
                # past ``pos``: a held tag prefix, outside any string, which holds no whole tag
                flag = sc.flags[a - sc.flags_base] if a < sc.pos else 0
                if _ends_turn(s, flag):
                    best = a + len(s)
                    break
                j = self.window.find(s, j + 1)
        keep = max(0, len(self.window) - self.longest + 1)
        if keep:
            self.window = self.window[keep:]
            self.base += keep
        sc.trim(min(self.base, sc.pos))
        return best


_DECODE_BACK = 6  # ids decoded again before the new ones, so that their text reads as in the whole
_MAX_WAIT = 16  # ids an incomplete UTF-8 character may wait for before its text is read as it is


class StopCheck:
    """The engine's stop-string check of one request, ids in: each call decodes the newest
    ids only (with a few before them, as vLLM's incremental detokenizer does) and feeds their
    text to a ``StopWatch``.

    Args:
        stops: the stop strings (non-empty).
        context: the turn's ids sampled before this request (a continuation after a
            preemption), read before its own ids.
    """

    __slots__ = ("stops", "context", "watch", "read")

    def __init__(self, stops: Sequence[str], context: Sequence[int] = ()) -> None:
        self.stops = tuple(stops)
        self.context = tuple(context)
        self.watch = StopWatch(self.stops)
        self.read = 0  # ids of the turn (context, then the request's own) whose text was fed

    def advance(self, decode: Decode, own_ids: Sequence[int], *, finished: bool) -> bool:
        """Read the request's ids ``own_ids`` (cumulative) past those read before; whether a
        stop string that ends the turn ends in their text. ``finished``: the request is over
        (an incomplete tail character or tag is read as it is)."""
        c = len(self.context)
        n = c + len(own_ids)
        if n <= self.read:
            return False

        def ids(a: int, b: int) -> list[int]:  # the turn's ids [a, b) without copying the whole turn
            if b <= c:
                return list(self.context[a:b])
            if a >= c:
                return list(own_ids[a - c:b - c])
            return list(self.context[a:]) + list(own_ids[:b - c])

        p = max(0, self.read - _DECODE_BACK)
        before = decode(ids(p, self.read)) if self.read > p else ""
        text = decode(ids(p, n))
        if not finished and text.endswith("\ufffd") and n - self.read < _MAX_WAIT:
            return False  # the next ids complete the character
        self.read = n
        return self.watch.feed(text[len(before):], final=finished) is not None
