"""A ReAct-style agent written only with the official ``openai`` SDK and function calling,
trained on ShellLookup through agentrl's gateway.

The agent knows nothing of agentrl: it gets a ``task`` (the first messages, the tools, and
``task.call_tools`` to run the calls where the task lives: its sandbox) and an
``openai.AsyncOpenAI`` client (``client``) already pointed at its episode's gateway session. It calls the
model, runs the tool calls it asks for, and stops when the model answers without one; the
task's verifier then scores the sandbox (the return value ``None`` says so).

Importing this module registers it as ``examples/ShellLookupAgent-v0``: the agent over
``agentrl/ShellLookup-v1``. Train it with ``examples/openai_agent/train.yaml`` (README,
"Bring your own agent").
"""

from __future__ import annotations

from agentrl.gateway import register_agent_env

ENV_ID = "examples/ShellLookupAgent-v0"


async def agent(task, client):
    messages = list(task.messages)
    while True:
        response = await client.chat.completions.create(model="policy", messages=messages, tools=task.tools)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls or response.choices[0].finish_reason == "length":
            return None  # the task's verifier scores what the agent did
        messages.extend(task.call_tools(message.tool_calls))
        if task.over:  # the task's tool-call budget is spent
            return None


register_agent_env(ENV_ID, agent=agent, task_env="agentrl/ShellLookup-v1")
