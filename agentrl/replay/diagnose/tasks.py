"""Hard tasks versus wrong tasks: a task whose samples agree with
each other on one final answer while the judge says every one is wrong more likely has a
wrong reference answer than a hard problem; a task with rare successes is hard.

"The judge says wrong": the episode is scored and not a success (``EpisodeFacts.success``).
Errored episodes (infra / reward errors) are left out: they are not judgements. Samples cut
short (termination ``length`` / ``context_limit``, or a last turn cut by ``max_new_tokens``)
gave no final answer: they are left out of the agreement (their "last number" fallback
would make cut samples look like agreement); ``wrong_reference`` needs MIN_TASK_SAMPLES
samples with a final answer.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from agentrl.replay.diagnose.data import EpisodeFacts
from agentrl.types import TerminationReason

CUT_SHORT = (TerminationReason.LENGTH, TerminationReason.CONTEXT_LIMIT)
"""Terminations that leave an episode without a final answer."""

MIN_TASK_SAMPLES = 4
"""Fewest scored samples of a task before it is classed: with 2 or 3 samples, agreement and
"rare" successes happen by chance (two random short answers agree easily)."""
AGREE_FRAC = 0.75
"""Share of a task's samples giving its most common (non-empty) answer above which they
"agree": a policy sampling at temperature ~1 rarely repeats itself on three of four samples
unless the answer is forced by the problem, so a judge rejecting all of them is suspect."""
HARD_MAX_SUCCESS = 0.25
"""Success rate at or below which a task with at least one success is "hard" (rare
successes: the learning signal is there but thin)."""


@dataclass(frozen=True)
class TaskVerdict:
    """One task's class: ``wrong_reference`` (samples agree, all judged wrong), ``unsolved``
    (no success, answers disagree), ``hard`` (0 < success rate <= HARD_MAX_SUCCESS), ``ok``,
    ``easy`` (every sample succeeds), or ``too_few`` (under MIN_TASK_SAMPLES scored).
    ``agreed_answer`` / ``agree_frac``: the modal normalised answer and its share of the
    ``answered`` samples (those not cut short, ``has_final_answer``)."""

    env_id: str
    task_id: str
    verdict: str
    samples: int
    successes: int
    agreed_answer: str
    agree_frac: float
    episode_ids: tuple[str, ...]
    answered: int = 0

    @property
    def success_rate(self) -> float:
        return self.successes / self.samples if self.samples else 0.0


def has_final_answer(e: EpisodeFacts) -> bool:
    """The episode ended on its own (not cut by ``max_new_tokens`` or the context budget)."""
    return e.termination not in CUT_SHORT and not (e.finish_reasons and e.finish_reasons[-1] == "length")


def classify_tasks(episodes: Iterable[EpisodeFacts]) -> list[TaskVerdict]:
    """Every task of ``episodes`` (scored ones only), classed as ``TaskVerdict`` says, sorted
    by env and task id."""
    by_task: dict[tuple[str, str], list[EpisodeFacts]] = defaultdict(list)
    for e in episodes:
        if e.scored:
            by_task[(e.env_id, e.task_id)].append(e)
    out = []
    for (env, task), eps in sorted(by_task.items()):
        n = len(eps)
        wins = sum(1 for e in eps if e.success)
        answered = [e for e in eps if has_final_answer(e)]
        answers = Counter(e.answer for e in answered if e.answer)
        answer, count = answers.most_common(1)[0] if answers else ("", 0)
        agree = count / len(answered) if answered else 0.0
        if n < MIN_TASK_SAMPLES:
            verdict = "too_few"
        elif wins == 0:
            verdict = ("wrong_reference" if len(answered) >= MIN_TASK_SAMPLES and agree >= AGREE_FRAC
                       else "unsolved")
        elif wins == n:
            verdict = "easy"
        elif wins / n <= HARD_MAX_SUCCESS:
            verdict = "hard"
        else:
            verdict = "ok"
        # examples: the agreeing samples first for a wrong reference, the successes for a hard task
        ok = {e.episode_id for e in answered}
        first = [e for e in eps if (e.episode_id in ok and e.answer == answer if verdict == "wrong_reference"
                                    else e.success)]
        ids = tuple(e.episode_id for e in first + [e for e in eps if e not in first])
        out.append(TaskVerdict(env, task, verdict, n, wins, answer, agree, ids, len(answered)))
    return out


__all__ = ["AGREE_FRAC", "CUT_SHORT", "HARD_MAX_SUCCESS", "MIN_TASK_SAMPLES", "TaskVerdict", "classify_tasks",
           "has_final_answer"]
