"""A classic-API (verifiers 0.3.x) environment scored by a ``JudgeRubric``, for the
``hub/Verifiers-v0`` runner tests: the judge is asked whether the answer is right ("yes":
1.0). ``load_environment(fail=True)`` adds a reward function that raises (verifiers would log
it and score 0; the adapter must fail the episode instead)."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


async def judged(judge, prompt, completion, answer, state, **kwargs) -> float:
    verdict = await judge(prompt, completion, answer, state)
    return 1.0 if "yes" in verdict.lower() else 0.0


def broken(completion, **kwargs) -> float:
    raise RuntimeError("this reward function is broken")


def load_environment(fail: bool = False) -> vf.Environment:
    rows = [{"question": "What is 2 + 2?", "answer": "4"}, {"question": "What is 3 + 3?", "answer": "6"}]
    rubric = vf.JudgeRubric(judge_model="judge-from-the-env")
    rubric.add_reward_func(judged, weight=1.0)
    if fail:
        rubric.add_reward_func(broken, weight=0.5)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=rubric)
