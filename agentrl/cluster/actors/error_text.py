"""The error a traceback text ends with, on one line: what an actor's one-line failure names as
its cause (``agentrl.cluster.actors.actor_errors.actor_failure_message``) when Ray hands over only the
text of a remote traceback.

How Python prints an exception (``traceback.format_exception``): for chained errors the cause
first, each traceback separated by ``The above exception was the direct cause of the following
exception:`` or ``During handling of the above exception, another exception occurred:``; each
traceback a header (``Traceback (most recent call last):``, which Ray replaces by
``ray::Actor.method() (pid=..., ip=...)``), its frames indented (``  File ...``, the source
line and ``^^^`` markers), then the exception at column 0: ``module.Type: message``, whose
message may go on over more lines. The exception raised last is therefore the first line at
column 0 after the frames of the last traceback; what follows it is its message, never a
new exception (a second line ``Note: x`` is part of the message, not an error ``Note``).

A pydantic ``ValidationError``'s message is ``N validation error(s) for Model`` and, per
error, its location at column 0 (``run.iterations``; none for a model-level error), the error
indented by two spaces with a ``[type=...]`` tail, and a ``For further information`` line.
"""

from __future__ import annotations

import re

_EXC_HEAD = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: (?P<msg>.*))?$")
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
_FRAME = "  File "
_PYDANTIC_TAIL = re.compile(r"\s*\[type=[^\]]*\]\s*$")
MAX_MESSAGE_CHARS = 600
"""A message longer than this (after joining its lines) is cut, ending in ``...``."""


def _last_traceback(lines: list[str]) -> list[str]:
    """The lines after the last chaining line: the traceback of the exception raised last."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip() in _CHAINED:
            return lines[i + 1:]
    return lines


def _exception_line(lines: list[str]) -> tuple[int, re.Match[str]] | None:
    """Index and match of the exception line: the first line at column 0 after the first run
    of frames; without frames (a bare ``Type: message`` text, or Ray hid every frame), the
    first line at column 0 that has the form of an exception line."""
    first_frame = next((i for i, ln in enumerate(lines) if ln.startswith(_FRAME)), None)
    if first_frame is None:
        for i, line in enumerate(lines):
            m = _EXC_HEAD.match(line)
            if m and not line.startswith("Traceback"):
                return i, m
        return None
    for i in range(first_frame, len(lines)):
        line = lines[i]
        if line.strip() and not line[0].isspace():
            m = _EXC_HEAD.match(line)
            return (i, m) if m else None
    return None


def _validation_errors(body: list[str]) -> list[str]:
    """``location: error`` for each error a pydantic ``ValidationError`` lists (``error`` alone
    for a model-level one, and without pydantic's ``Value error, `` prefix and ``[type=...]``
    tail)."""
    out: list[str] = []
    location = ""
    for line in body:
        text = line.strip()
        if not text or text.startswith("For further information"):
            continue
        if not line[0].isspace():
            location = text
            continue
        error = _PYDANTIC_TAIL.sub("", text).removeprefix("Value error, ")
        out.append(f"{location}: {error}" if location else error)
        location = ""
    return out


def _cut(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def raised_error(text: str) -> str | None:
    """``Type: message`` of the error a traceback text ends with (a ``RayTaskError``'s, or the
    creation-task error inside an ``ActorDiedError``), on one line; None when the text holds
    no exception line (see the module docstring for how it is found).

    The module path of the type is dropped (``ConfigError``). A message over several lines is
    joined with ``" "`` (cut at ``MAX_MESSAGE_CHARS``). A pydantic ``ValidationError`` is given
    by its errors, each with its location (``ValidationError: run.iterations: Input should be
    greater than or equal to 1``; several joined with ``"; "``), the ``1 validation error for
    Config`` header only when no error follows it.

    Example::

        raised_error("ray::A.__init__() (pid=1, ip=10.0.0.2)\\n  File \\"a.py\\", line 3, in __init__\\n"
                     "    raise ConfigError('bad')\\nagentrl.errors.ConfigError: bad\\nNote: x")
        # -> "ConfigError: bad Note: x"
    """
    lines = _last_traceback(text.splitlines())
    found = _exception_line(lines)
    if found is None:
        return None
    at, m = found
    kind = m.group("type").rsplit(".", 1)[-1]
    head = (m.group("msg") or "").strip()
    body = lines[at + 1:]
    if kind == "ValidationError":
        errors = _validation_errors(body)
        msg = "; ".join(errors) if errors else head
    else:
        msg = " ".join(" ".join([head, *body]).split())
    return f"{kind}: {_cut(msg)}" if msg else kind


__all__ = ["MAX_MESSAGE_CHARS", "raised_error"]
