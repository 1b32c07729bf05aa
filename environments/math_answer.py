"""``agentrl/MathAnswer-v0``: short word problems and quick computations answered in one
reply, scored by a deliberately plain rule checker, with a labelled set of candidate answers
for measuring how far a checker (the rule, or an LLM judge) agrees with a human label.
Pure Python, no sandbox.

Why it is here
    Many correct answers to a math question are written in forms a string rule does not
    recognise: ``96%`` for ``0.96``, ``pi`` for ``π``, ``5000 m`` for ``5 km``, ``twelve``
    for ``12``, ``2/4`` for ``1/2``, ``sqrt(2)`` for ``√2``, ``−5`` (Unicode minus) for
    ``-5``, ``3e4`` or ``30,000`` for ``30000``. The env's own reward misses them on purpose,
    so a judge reward (``agentrl.rewards``) has something to add, and the labelled answers
    measure both.

Tasks and split
    120 tasks in ``environments/data/math_answer.jsonl`` (package data), one JSON object a
    line: ``task_id`` (``math/000`` .. ``math/119``), ``kind`` (``percent``, ``pi``,
    ``units``, ``scientific``, ``separators``, ``words``, ``fractions``, ``sqrt``,
    ``negative``, ``rounding``, ``word``), ``question``, ``reference`` (the canonical answer)
    and ``answers``: 4-7 candidates, each ``{"answer": str, "equivalent": bool}``. The split
    is by the id's number: ``n % 4 == 3`` is ``test`` (30 tasks), the rest ``train`` (90);
    ``all`` is both. Fixed content, read once; nothing is drawn at load.

Labels
    ``equivalent`` is true when the candidate states the same quantity as the reference:
    another notation of the same number (percent, fraction, decimal, scientific notation,
    thousands separators, words, an unsimplified fraction or root, Unicode minus, ``x = 4``),
    or the same quantity in another unit (``165 cm`` for ``1.65 m``); a bare number counts
    when the question fixes the unit. An approximation is not equivalent when the task asks
    for an exact value (``3.14`` for ``π``), and when the task asks for a precision (decimal
    places, significant figures, nearest cent) only an answer at that precision is.

Actions and reward
    Single-turn: the reply's final answer is the text after its last ``Answer:`` (any case)
    up to the end of that line, else its last non-empty line, stripped (``extract_answer``).
    ``rule_equivalent(reference, answer)`` decides the reward: ``1.0`` or ``0.0``;
    ``info["success"]`` says the same. An empty final answer is an invalid action. The
    episode terminates after the one step (never truncated).

For a judge
    ``reset``'s info carries ``StepInfo.reference_answer`` (the task's reference; info key
    ``reference_answer``) beside the env keys ``task_id`` and ``split``; the terminal step's
    info carries ``StepInfo.final_answer`` (the extracted final answer, ``""`` for a blank
    reply; info key ``final_answer``) beside ``task_id``. The instance keeps them too:
    ``reference`` (the current task's) and ``final_answer`` (None until the step).

Anchor
    ``(task_id, 0)`` at reset and ``(task_id, 1)`` after the answer: one decision per task.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl.errors import ConfigError
from agentrl.types import StepInfo
from environments.core import TextEnv

__all__ = ["ENV_ID", "SPLITS", "LabelledAnswer", "MathTask", "MathAnswerEnv", "extract_answer", "load_tasks",
           "rule_equivalent", "split_of"]

ENV_ID = "agentrl/MathAnswer-v0"
SPLITS = ("train", "test", "all")
DATA_FILE = ("data", "math_answer.jsonl")
"""The data file's path inside the ``environments`` package."""

_PLAIN_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)", re.ASCII)
_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)
_TASK_ID = re.compile(r"math/([0-9]{3})", re.ASCII)


@dataclass(frozen=True)
class LabelledAnswer:
    """One candidate answer and whether it states the same quantity as the reference
    (module docstring, "Labels")."""

    answer: str
    equivalent: bool


@dataclass(frozen=True)
class MathTask:
    """One task of the data file.

    Attributes:
        task_id: ``math/NNN``.
        kind: the family of forms it exercises (``percent``, ``pi``, ...).
        question: the question as the policy reads it.
        reference: the canonical answer.
        answers: the labelled candidates, in file order.
    """

    task_id: str
    kind: str
    question: str
    reference: str
    answers: tuple[LabelledAnswer, ...]


def split_of(task_id: str) -> str:
    """``"test"`` when the id's number is 3 mod 4, else ``"train"``.

    Raises:
        ConfigError: ``task_id`` is not ``math/NNN``.
    """
    m = _TASK_ID.fullmatch(task_id) if isinstance(task_id, str) else None
    if m is None:
        raise ConfigError(f"task_id={task_id!r} is not a MathAnswer task id; expected 'math/NNN' (e.g. 'math/000')")
    return "test" if int(m.group(1)) % 4 == 3 else "train"


def _parse_row(lineno: int, line: str) -> MathTask:
    where = f"{'/'.join(DATA_FILE)} line {lineno}"
    try:
        row = json.loads(line)
        answers = tuple(LabelledAnswer(a["answer"], a["equivalent"]) for a in row["answers"])
        task = MathTask(row["task_id"], row["kind"], row["question"], row["reference"], answers)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: {type(exc).__name__}: {exc}; expected a JSON object with task_id, kind, "
                          "question, reference and answers [{answer, equivalent}]") from exc
    split_of(task.task_id)
    texts = (task.kind, task.question, task.reference, *(a.answer for a in answers))
    if not all(isinstance(t, str) and t.strip() for t in texts):
        raise ConfigError(f"{where}: kind, question, reference and every answer must be non-empty str")
    if len(answers) < 3 or not all(isinstance(a.equivalent, bool) for a in answers):
        raise ConfigError(f"{where}: {len(answers)} answers; expected >= 3, each with a bool 'equivalent'")
    return task


@functools.lru_cache(maxsize=1)
def load_tasks() -> tuple[MathTask, ...]:
    """Every task of the data file, in file order (read once, then cached).

    Raises:
        ConfigError: the file is missing, a line is malformed, or an id repeats (the message
            names the line).
    """
    path = importlib.resources.files("environments").joinpath(*DATA_FILE)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read environments/{'/'.join(DATA_FILE)} ({exc}); it ships as package data") from exc
    tasks = [_parse_row(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise ConfigError(f"environments/{'/'.join(DATA_FILE)}: repeated task ids {repeated}; each must be unique")
    return tuple(tasks)


@functools.lru_cache(maxsize=1)
def _by_id() -> dict[str, MathTask]:
    return {t.task_id: t for t in load_tasks()}


def _tasks_of(split: str) -> list[MathTask]:
    if split not in SPLITS:
        raise ConfigError(f"split={split!r} is not one of {SPLITS}")
    return [t for t in load_tasks() if split == "all" or split_of(t.task_id) == split]


def extract_answer(text: str) -> str:
    """The final answer of a reply: what follows its last ``Answer:`` (any case) up to the end
    of that line, else its last non-empty line; stripped. ``""`` when there is none."""
    matches = list(_ANSWER.finditer(text))
    if matches:
        return text[matches[-1].end():].split("\n", 1)[0].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def rule_equivalent(reference: str, answer: str) -> bool:
    """The env's rule checker, deliberately plain: equal after stripping and lower-casing, or
    both plain decimals (optional sign, ASCII digits, at most one point: no ``%``, units,
    commas, exponents or fractions) whose floats agree (``math.isclose``, rel_tol 1e-9). So
    ``"0.960"`` matches ``"0.96"`` but ``"96%"``, ``"24/25"``, ``"pi"`` and ``"5000 m"`` match
    nothing but themselves."""
    ref, ans = reference.strip().lower(), answer.strip().lower()
    if ref == ans:
        return True
    if _PLAIN_DECIMAL.fullmatch(ref) and _PLAIN_DECIMAL.fullmatch(ans):
        return math.isclose(float(ref), float(ans), rel_tol=1e-9, abs_tol=1e-12)
    return False


JUDGE_RUBRIC: dict[str, Any] = {
    "name": "math-answer-equivalence",
    "criteria": [{
        "name": "equivalent",
        "description": "The answer denotes the same value as the reference answer, in any equivalent form: a "
                       "percent, fraction or decimal of the same number, pi written as a symbol, a word or digits to "
                       "the precision the task asks, the same quantity in another unit, scientific notation, "
                       "thousands separators, a number written in words, an unsimplified fraction. 1 when "
                       "equivalent, 0 when not (a different value, a wrong sign, a wrong unit, a rounding the task "
                       "did not ask for).",
    }],
}
"""The rubric a judge scores this env by (``reward.judge``): one criterion, equivalence to the
reference in any form, which the rule checker (``rule_equivalent``) misses."""


class MathAnswerEnv(TextEnv):
    """One math question, one reply; see the module docstring.

    Args:
        sandbox: ignored (accepted so ``make_env(..., sandbox=...)`` works for every env).
        split: the tasks ``reset`` draws from when ``options`` names none.
        render_mode: None or ``"ansi"``.

    Attributes:
        reference: the current task's reference answer (None before ``reset``).
        final_answer: the answer extracted from the reply (None until ``step``).

    Raises:
        ConfigError: an unknown split or render mode.
    """

    uses_sandbox = False  # runs in-process: the rollout makes it without a sandbox
    judge_rubric: ClassVar[dict[str, Any]] = JUDGE_RUBRIC  # what reward.judge scores by, unless reward.rubric says
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, sandbox: Any = None, split: str = "train", render_mode: str | None = None) -> None:
        super().__init__()
        self._split_ids = [t.task_id for t in _tasks_of(split)]  # validates the split
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; expected None or 'ansi'")
        self.split = split
        self.render_mode = render_mode
        self.reference: str | None = None
        self.final_answer: str | None = None
        self._last = ""

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        """``math/NNN`` ids of ``split`` in file order. Raises ConfigError for an unknown split."""
        return [t.task_id for t in _tasks_of(split)]

    @classmethod
    def get_task(cls, task_id: str) -> MathTask:
        """The task ``task_id``. Raises ConfigError for an unknown id."""
        task = _by_id().get(task_id) if isinstance(task_id, str) else None
        if task is None:
            raise ConfigError(f"task_id={task_id!r} is not a MathAnswer task; expected one of math/000 .. "
                              f"math/{len(load_tasks()) - 1:03d}")
        return task

    @classmethod
    def labelled_answers(cls, split: str = "train") -> list[tuple[str, str, bool]]:
        """``(task_id, answer, equivalent)`` for every labelled candidate of ``split``, in file
        order: the set on which a checker's (rule's or judge's) accuracy is measured.

        Raises:
            ConfigError: an unknown split.
        """
        return [(t.task_id, a.answer, a.equivalent) for t in _tasks_of(split) for a in t.answers]

    @classmethod
    def rule_equivalent(cls, reference: str, answer: str) -> bool:
        """The env's rule checker (module function ``rule_equivalent``)."""
        return rule_equivalent(reference, answer)

    @classmethod
    def checker_actions(cls) -> list[str]:
        """For ``check_env``: a reply with an ``Answer:`` line (it ends the episode)."""
        return ["The result follows from the question.\nAnswer: 0.96", "Answer: 42"]

    @property
    def system_prompt(self) -> str:
        return ("Solve the math problem. You may reason briefly first. End your reply with one line of the form "
                "\"Answer: <answer>\" that holds only the final answer.")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Pose ``options["task_id"]`` (else a task drawn from the split with ``np_random``).

        Raises:
            EnvError: after ``close``. ConfigError: an unknown option or task id.
        """
        requested = self._start_reset(seed, options)
        task = self.get_task(requested if requested is not None else self._draw(self._split_ids))
        self._task_id, self._done = task.task_id, False
        self.reference, self.final_answer = task.reference, None
        self._last = f"{task.question}\n\nEnd your reply with a line \"Answer: <answer>\"."
        info = StepInfo(anchor=(task.task_id, 0), system_prompt=self.system_prompt, tools=(),
                        reference_answer=task.reference).to_info(task_id=task.task_id, split=split_of(task.task_id))
        return self._last, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score the reply's final answer with ``rule_equivalent``; the episode terminates.

        Raises:
            EnvError: no episode running, or ``action`` is not a str.
        """
        self._check_step(action)
        assert self._task_id is not None and self.reference is not None
        answer = extract_answer(action)
        success = bool(answer) and rule_equivalent(self.reference, answer)
        self.final_answer, self._done = answer, True
        self._last = f"Answer recorded: {answer}" if answer else "No answer found in the reply."
        info = StepInfo(anchor=(self._task_id, 1), invalid_action=not answer, success=success,
                        final_answer=answer).to_info(task_id=self._task_id)
        return self._last, 1.0 if success else 0.0, True, False, info

    def render(self) -> str | None:
        return self._last if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Nothing to release; idempotent."""
        super().close()
