#!/usr/bin/env python3
"""A ReAct-style agent that runs inside the task's sandbox, as a coding CLI would: the
Python standard library only (it runs on the sandbox's own ``python3``), the OpenAI Chat
Completions API over HTTP with function calling, its ``bash`` tool run right here.

It reads what the gateway sets: ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (its episode's
session), ``AGENTRL_MODEL``, and ``AGENTRL_TASK_FILE`` (the task's first messages and tools).
It stops when the model answers without a tool call, or after ``MAX_CALLS`` calls; the
task's verifier then scores the sandbox.

``command_agent.py`` registers it (``examples/ShellLookupCommandAgent-v0``).
"""

import json
import os
import subprocess
import urllib.request

MAX_CALLS = 8


def chat(messages, tools):
    body = {"model": os.environ["AGENTRL_MODEL"], "messages": messages, "tools": tools}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
        {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["choices"][0]


def main():
    with open(os.environ["AGENTRL_TASK_FILE"], encoding="utf-8") as f:
        task = json.load(f)
    messages = list(task["messages"])
    for _ in range(MAX_CALLS):
        choice = chat(messages, task["tools"])
        message = {k: v for k, v in choice["message"].items() if v is not None}
        messages.append(message)
        if not message.get("tool_calls") or choice["finish_reason"] == "length":
            return
        for call in message["tool_calls"]:
            try:
                command = json.loads(call["function"]["arguments"])["command"]
                done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
                output = (done.stdout + done.stderr)[-4000:] or "(no output)"
            except (ValueError, KeyError, TypeError) as exc:
                output = "error: the call's arguments are not {\"command\": ...}: %s" % exc
            except subprocess.TimeoutExpired:
                output = "error: the command ran past 30 s"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})


if __name__ == "__main__":
    main()
