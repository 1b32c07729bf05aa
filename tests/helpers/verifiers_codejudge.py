"""A v1 (verifiers 0.4.x) taskset whose reward calls a ``vf.Judge`` from task code, for the
``hub/Verifiers-v0`` judge routing tests: no judge is plugged in the task config, so only the
runner's repointing of every judge verifiers makes keeps it off verifiers' default endpoint
(Prime's; ``PRIME_INFERENCE_URL`` overrides it). Config ``judge_url``: the judge is made with
an endpoint of the task's own (``base_url``, model ``task-judge-model``) instead of the
defaults. Reward ``judged``: 1.0 when the judge says "yes". Harness: ``OneCallHarness``."""

from __future__ import annotations

import verifiers.v1 as vf
from verifiers_taskset import OneCallHarness, WordData


class CodeJudgeTasksetConfig(vf.TasksetConfig):
    judge_url: str = ""


class CodeJudgeData(WordData):
    judge_url: str = ""


class CodeJudgeTask(vf.Task[CodeJudgeData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def judged(self, task, trace) -> float:
        config = vf.JudgeConfig(base_url=task.judge_url, model="task-judge-model") if task.judge_url else None
        reply = await vf.Judge(config).complete(f"Is this a sentence with {task.word}? {trace.last_reply}")
        return 1.0 if "yes" in reply.text.lower() else 0.0


class CodeJudgeTaskset(vf.Taskset[CodeJudgeTask, CodeJudgeTasksetConfig]):
    def load(self):
        yield CodeJudgeTask(CodeJudgeData(prompt="Use the word 'apple'.", word="apple",
                                          judge_url=self.config.judge_url), self.config.task)


__all__ = ["CodeJudgeTaskset", "OneCallHarness"]
