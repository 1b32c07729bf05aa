"""A classic-API (verifiers 0.3.x) single-turn environment for the ``hub/Verifiers-v0``
tests, loaded by the adapter's runner from the verifiers-0.3.1 hub venv
(``load_environment``): short questions, scored by two weighted reward functions (a digit in
the answer, brevity) and one metric (weight 0), so rewards differ between answers."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

QUESTIONS = ["What is 2 + 2?", "Name a prime number.", "How many legs has a cat?", "What is 10 - 3?"]


def _text(completion) -> str:
    return " ".join(str(m["content"] or "") for m in completion if m["role"] == "assistant")


def has_digit(completion, **kwargs) -> float:
    return 1.0 if any(c.isdigit() for c in _text(completion)) else 0.0


def brevity(completion, **kwargs) -> float:
    return 1.0 - min(len(_text(completion)), 200) / 200


def vowels(completion, **kwargs) -> float:
    return float(sum(c in "aeiou" for c in _text(completion)))


def load_environment(n: int = 4) -> vf.Environment:
    rows = [{"question": q, "answer": ""} for q in QUESTIONS[:n]]
    rubric = vf.Rubric(funcs=[has_digit, brevity, vowels], weights=[0.5, 0.5, 0.0])
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows[:2]),
                            system_prompt="Answer in a few words.", rubric=rubric)
