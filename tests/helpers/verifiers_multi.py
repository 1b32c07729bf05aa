"""A classic-API (verifiers 0.3.x) multi-turn environment for the ``hub/Verifiers-v0``
tests: ``env_response`` is scripted (it asks for one more sentence, naming the turn), two
turns, scored by how many of the assistant turns are non-empty and by their total length."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

TOPICS = ["cats", "rivers", "clocks", "bread"]


class MoreEnv(vf.MultiTurnEnv):
    """After each answer: ``Turn <k> done. Say one more thing about <topic>.``"""

    async def env_response(self, messages, state, **kwargs):
        k = len(state["trajectory"])
        return [vf.UserMessage(content=f"Turn {k} done. Say one more thing about {state['answer']}.")]


def _answers(completion) -> list[str]:
    return [str(m["content"] or "") for m in completion if m["role"] == "assistant"]


def answered(completion, **kwargs) -> float:
    texts = _answers(completion)
    return sum(1.0 for t in texts if t.strip()) / max(1, len(texts))


def length(completion, **kwargs) -> float:
    return min(sum(len(t) for t in _answers(completion)), 300) / 300


def load_environment(turns: int = 2) -> vf.Environment:
    rows = [{"question": f"Say something about {t}.", "answer": t} for t in TOPICS]
    rubric = vf.Rubric(funcs=[answered, length], weights=[0.3, 0.7])
    return MoreEnv(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=turns, system_prompt="Be brief.")
