"""Final answers as ``agentrl diagnose`` compares them: the content of the last complete
``<answer>...</answer>`` pair (tag names in any case; reasoning-gym's format, which
``hub/ReasoningGym-v0`` scores), taken whole, or the last ``\\boxed{...}`` inside it; else the
content of the last ``\\boxed{...}`` read with brace matching, else what follows the last
``answer:``, else the last number, else the whole text; lower-cased, whitespace collapsed,
numbers in one exact form (``2``, ``2.0``, ``+2.00`` and ``2`` agree; ``1,000`` is ``1000``;
every digit is kept, so ``1000001`` and ``1000002`` stay different answers).

Why brace matching: LaTeX answers hold braces (``\\boxed{\\frac{1}{2}}``,
``\\boxed{\\sqrt{2}}``, ``\\boxed{\\{1, 2\\}}``); a regular expression that stops at the first
``}`` reads all of ``\\frac{1}{2}``, ``\\frac{3}{2}`` and ``\\sqrt{2}`` as "2", so different
wrong answers look like agreement. This is the one place in the project that extracts a
``\\boxed`` answer.
"""

from __future__ import annotations

import re
from decimal import Decimal

BOX_COMMANDS = ("boxed", "fbox")
"""LaTeX commands whose braced argument is a final answer (``\\boxed{}``, ``\\fbox{}``)."""

_BOX_START = re.compile(r"\\(?:%s)(?![A-Za-z])\s*" % "|".join(BOX_COMMANDS))
_ANSWER = re.compile(r"answer\s*[:=]\s*(.+)", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
"""A decimal number: an optional sign, digits with or without thousands separators
(``1,000,000``), an optional fraction (``.5``, ``2.50``)."""
_SPACE = re.compile(r"\s+")
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"


def _braced(text: str, start: int) -> int | None:
    """Index just past the ``}`` that closes the ``{`` at ``text[start]``; ``None`` when it is
    never closed. ``\\{`` and ``\\}`` are literal braces (TeX's escapes), not structure."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2  # an escaped character, \{ and \} included
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last top-level ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``
    (whitespace allowed between the command and its ``{``; nested braces kept whole, a box
    inside a box belongs to the outer one).

    Returns:
        The content between the braces, unstripped; ``""`` when the last box is never
        closed (a text cut inside its answer has no answer); ``None`` when ``text`` holds no
        box with a braced argument.
    """
    found: str | None = None
    pos = 0
    while True:
        m = _BOX_START.search(text, pos)
        if m is None:
            return found
        brace = m.end()
        if brace >= len(text) or text[brace] != "{":
            pos = m.end()  # \boxed without a braced argument: not a box
            continue
        end = _braced(text, brace)
        if end is None:
            return ""  # the last box is unbalanced: no answer
        found = text[brace + 1 : end - 1]
        pos = end


def last_answer_tag(text: str) -> str | None:
    """The text inside the last complete ``<answer>...</answer>`` pair of ``text`` (tag
    names in any case), unstripped; None when there is no complete pair."""
    low = text.lower()
    end = low.rfind(_ANSWER_CLOSE)
    start = low.rfind(_ANSWER_OPEN, 0, end) if end >= 0 else -1
    return text[start + len(_ANSWER_OPEN):end] if start >= 0 else None


def normalize_answer(text: str) -> str:
    """The comparable form of a final answer (see the module docstring); ``""`` for none,
    also when the last ``\\boxed{`` is never closed."""
    text = text.strip()
    tagged = last_answer_tag(text)
    boxed = last_boxed(text if tagged is None else tagged)
    if boxed is not None:
        text = boxed
    elif tagged is not None:
        text = tagged  # whole: "3/4" is one answer, not its last number
    else:
        answers = _ANSWER.findall(text)
        if answers:
            text = answers[-1]
        else:
            numbers = _NUMBER.findall(text)
            if numbers:
                text = numbers[-1]
    text = _SPACE.sub(" ", text).strip().rstrip(".").lower()
    if not _NUMBER.fullmatch(text):
        text = text.lstrip(".")  # a leading dot is part of a number (.5), else punctuation
    if _NUMBER.fullmatch(text):
        text = exact_number(text)
    return text


def exact_number(text: str) -> str:
    """One exact form of a decimal number that :data:`_NUMBER` matches: thousands separators
    and a ``+`` sign dropped, trailing fraction zeros dropped, never an exponent, every
    significant digit kept (``"1,000"`` -> ``"1000"``, ``"-2.50"`` -> ``"-2.5"``, ``"2.0"`` ->
    ``"2"``, ``"-0"`` -> ``"0"``, ``"3.14159265"`` -> ``"3.14159265"``)."""
    value = Decimal(text.replace(",", ""))
    if value == value.to_integral_value():
        return str(int(value))
    return format(value, "f").rstrip("0")  # exact at any length, unlike Decimal.normalize()


__all__ = ["BOX_COMMANDS", "last_answer_tag", "last_boxed", "normalize_answer"]
