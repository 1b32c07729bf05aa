"""An agent command on a Harbor task (``register_harbor_agent``): it runs in the task's own
container (its image, its working directory, its ``no-network`` policy), reaches the model
through the gateway's forwarder with ``OPENAI_BASE_URL``, and when it exits 0 the task's
``tests/test.sh`` scores the container. The model is the gateway tests' scripted vLLM engine
(a ``bash`` tool call each time); the agent (standard library Python) asks it once, then does
the task itself, or does nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import gymnasium
import pytest

from agentrl.gateway import AgentCommand
from agentrl.hubs.harbor_agent import register_harbor_agent
from agentrl.hubs.harbor_runtime import IMAGES, image_name
from agentrl.hubs.harbor_task import load_task
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, SamplingRecord
from sandboxes.docker.daemon import docker_client
from tests.helpers.sandbox_checks import containers_with_label, require_docker, wait_until
from tests.integration.gateway.conftest import bwrap_env_factory, scripted  # noqa: F401 (the scripted engine)

pytestmark = [pytest.mark.slow, pytest.mark.docker]

TASK = Path(__file__).resolve().parents[2] / "helpers" / "harbor_tasks" / "hello-file"
AGENT = r'''
import json, os, urllib.request

task = json.load(open(os.environ["AGENTRL_TASK_FILE"]))
body = {"model": os.environ["AGENTRL_MODEL"], "messages": task["messages"], "tools": task["tools"]}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                             {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                              "Content-Type": "application/json"})
msg = json.loads(urllib.request.urlopen(req, timeout=300).read())["choices"][0]["message"]
print("calls", len(msg.get("tool_calls") or []), "in", os.getcwd(), flush=True)
if os.environ.get("SOLVE"):
    with open("greeting.txt", "w") as f:
        f.write("hello " + open("name.txt").read().strip() + "\n")
'''


@pytest.fixture
def env_ids():
    require_docker()
    ids = ["tests/HarborCommandSolves-v0", "tests/HarborCommandIdles-v0"]
    yield ids
    for env_id in ids:
        gymnasium.registry.pop(env_id, None)
    client = docker_client()
    try:
        client.images.remove(image_name(load_task(TASK)), force=True)
    except Exception:  # noqa: BLE001 - best effort
        pass
    finally:
        client.close()
        IMAGES.clear()


def test_an_agent_command_works_in_the_tasks_container_and_the_verifier_scores_it(scripted, env_ids):  # noqa: F811
    run_id = f"test-harbor-cmd-{uuid.uuid4().hex[:8]}"
    for env_id, env in zip(env_ids, ({"SOLVE": "1"}, {})):
        register_harbor_agent(env_id, path=str(TASK), agent=AgentCommand('python3 "$AGENTRL_AGENT_DIR/agent.py"',
                                                                          env=env, files={"agent.py": AGENT}))
    engine, chat = scripted
    worker = RolloutWorker(engine, chat, bwrap_env_factory(run_id),
                           RolloutLimits(max_turns=4, max_new_tokens=96, max_context_tokens=4096),
                           SamplingRecord(temperature=1.0), env_timeout_s=120)
    solved, idle = worker.run([EpisodeRequest(env_id=e, task_id="hello-file", seed=0, group_id=f"g{i}", sample_seed=0)
                               for i, e in enumerate(env_ids)], policy_version=0)
    for ep in (solved, idle):
        assert ep.error is None, ep.error
        assert len(ep.turns) == 1 and ep.turns[0].tool_calls == 1  # the one call it made, answered by the model
    assert (solved.total_reward, idle.total_reward) == (1.0, 0.0)
    # the task containers carried the run's label (the run's sandbox lent it) and are gone
    assert wait_until(lambda: containers_with_label(run_id) == [], 10.0)
