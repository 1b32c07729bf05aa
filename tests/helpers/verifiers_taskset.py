"""A v1 (verifiers 0.4.x) taskset for the ``hub/Verifiers-v0`` tests, with a harness of its
own that runs in-process (no program to install): one chat call through verifiers'
interception, the task's prompt and system prompt as messages. Rewards: ``@vf.reward``
methods ``mentions`` (weight 0.75: the reply names the task's word) and ``short`` (weight
0.25), a ``@vf.metric`` ``reply_chars``. ``WORDS`` sets the tasks; config ``n`` how many."""

from __future__ import annotations

import openai
import verifiers.v1 as vf

WORDS = ["apple", "river", "stone", "cloud", "light"]


class WordData(vf.TaskData):
    word: str = ""


class WordTask(vf.Task[WordData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.75)
    async def mentions(self, task, trace) -> float:
        return 1.0 if task.word in trace.last_reply.lower() else 0.0

    @vf.reward(weight=0.25)
    async def short(self, trace) -> float:
        return 1.0 - min(len(trace.last_reply), 100) / 100

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))


class WordTasksetConfig(vf.TasksetConfig):
    n: int = len(WORDS)


class WordTaskset(vf.Taskset[WordTask, WordTasksetConfig]):
    def load(self):
        for word in WORDS[: self.config.n]:
            yield WordTask(WordData(prompt=f"Use the word '{word}' in a sentence.", system_prompt="Be brief.",
                                    word=word), self.config.task)


class OneCallConfig(vf.HarnessConfig):
    pass


class OneCallHarness(vf.Harness[OneCallConfig]):
    """One chat call, in-process; a refused call (the rollout was stopped) ends it."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        system, prompt = self.resolve_prompt(data)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            try:
                r = await client.chat.completions.create(model=ctx.model, messages=messages)
            except openai.APIStatusError as exc:
                return vf.ProgramResult(exit_code=1, stdout="", stderr=str(exc))
        return vf.ProgramResult(exit_code=0, stdout=r.choices[0].message.content or "", stderr="")


__all__ = ["WordTaskset", "OneCallHarness"]
