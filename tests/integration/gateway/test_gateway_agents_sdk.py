"""A client of the gateway that nobody here wrote: an agent built with the OpenAI Agents SDK
(``openai-agents``: ``Agent`` + ``Runner`` with a function tool), pointed at the gateway with
no change to the SDK, runs ShellLookup episodes in real bubblewrap sandboxes, and the
episodes train (credit assignment packs their sampled tokens into a ``TokenBatch``).

The engine is the package's scripted one (conftest.py: real vLLM, every call answered with a
``bash`` tool call), so the Runner runs the tool each turn until its own turn limit; the
agent then lets ShellLookup's checks score the sandbox.
"""

from __future__ import annotations

import json
import uuid

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
)
from agents.exceptions import MaxTurnsExceeded

from agentrl.config import AlgorithmConfig
from agentrl.credit import assign_credit
from agentrl.gateway import register_agent_env
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, SamplingRecord
from tests.integration.gateway.conftest import COMMAND, bwrap_env_factory

pytestmark = pytest.mark.slow

RAN: list[str] = []


async def agents_sdk_agent(task, client):
    @function_tool
    def bash(command: str) -> str:
        """Run a bash command in the task's working directory."""
        RAN.append(command)
        call = {"id": "call_0", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        return task.call_tools([call])[0]["content"]

    agent = Agent(name="shell", instructions=task.messages[0]["content"], tools=[bash],
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                  model_settings=ModelSettings(temperature=1.0))
    try:
        await Runner.run(agent, input=task.messages[-1]["content"], max_turns=2,
                         run_config=RunConfig(tracing_disabled=True))
    except MaxTurnsExceeded:
        pass  # the scripted model never stops calling the tool
    return None  # ShellLookup's checks score the sandbox


register_agent_env("tests/AgentsSdkShellLookup-v0", agent=agents_sdk_agent, task_env="agentrl/ShellLookup-v1")


@pytest.fixture(scope="module")
def worker(scripted):
    engine, chat = scripted
    run_id = f"test-gw-sdk-{uuid.uuid4().hex[:8]}"
    factory = bwrap_env_factory(run_id)

    return RolloutWorker(engine, chat, factory, RolloutLimits(max_turns=4, max_new_tokens=96, max_context_tokens=4096),
                         SamplingRecord(temperature=1.0), env_timeout_s=120)


def test_an_openai_agents_sdk_agent_runs_shell_lookup_episodes_that_train(worker):
    RAN.clear()
    reqs = [EpisodeRequest(env_id="tests/AgentsSdkShellLookup-v0", task_id=f"lookup/{i}", seed=i, group_id=f"g{i}",
                           sample_seed=i) for i in range(2)]
    episodes = worker.run(reqs, policy_version=0)
    for ep in episodes:
        assert ep.error is None, ep.error
        assert ep.total_reward is not None  # scored by ShellLookup's checks, not an infra error
        assert len(ep.turns) == 2 and all(t.tool_calls == 1 for t in ep.turns)
        assert all(t.branch == 0 for t in ep.turns)  # the SDK resends its history: no fork
    assert RAN == [COMMAND] * 4  # each call's tool ran in the task's sandbox
    res = assign_credit(episodes, AlgorithmConfig(), SamplingRecord(temperature=1.0))
    assert res.batch.num_loss_tokens == sum(len(t.completion_ids) for e in episodes for t in e.turns)
