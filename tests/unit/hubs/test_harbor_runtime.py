"""The Docker side of ``hub/Harbor-v0`` (agentrl/hubs/harbor_runtime.py) without Docker: one
build per image at a time (a build past its timeout holds the image until it ends, a second
reset waits for it and never starts another, a late success marks the image ready), and a
process of the agent that outlives its kill is an infrastructure error naming it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import agentrl.hubs.harbor_runtime as runtime
from agentrl.errors import InfraError
from agentrl.hubs.harbor_runtime import ImageCache, image_name, stop_agent
from agentrl.hubs.harbor_task import HarborError, load_task
from agentrl.types import ExecResult

TASKS = Path(__file__).resolve().parents[2] / "helpers" / "harbor_tasks"


class _Client:
    def close(self) -> None:
        pass


@pytest.fixture
def builds(monkeypatch):
    """``build_image`` blocked until ``release`` is set; ``started`` counts the builds begun."""
    state = {"started": 0, "release": threading.Event(), "fail": False}

    def build_image(name, *, dockerfile, context, client):
        state["started"] += 1
        assert state["release"].wait(30), "the test never released the build"
        if state["fail"]:
            raise RuntimeError("the Dockerfile's RUN failed")

    monkeypatch.setattr(runtime, "build_image", build_image)
    monkeypatch.setattr(runtime, "docker_client", lambda **kwargs: _Client())
    yield state
    state["release"].set()


def test_a_build_past_its_timeout_is_the_only_build_of_its_image_until_it_ends(builds):
    cache, task = ImageCache(), load_task(TASKS / "hello-file")  # build_timeout_sec 300
    multiplier = 0.3 / 300  # 0.3 s
    with pytest.raises(HarborError, match="ran past build_timeout_sec .* the build goes on") as first:
        cache.ensure(task, _Client(), None, multiplier)
    assert isinstance(first.value, InfraError) and builds["started"] == 1
    with pytest.raises(HarborError, match="an earlier build of .* still runs"):
        cache.ensure(task, _Client(), None, multiplier)  # waits 0.3 s for the first build, starts none
    assert builds["started"] == 1

    waiter: dict[str, object] = {}
    thread = threading.Thread(target=lambda: waiter.update(name=cache.ensure(task, _Client(), None, 10 / 300)))
    thread.start()  # waits for the first build (10 s at most) ...
    builds["release"].set()  # ... which ends well, late
    thread.join(15)
    assert waiter["name"] == image_name(task) and builds["started"] == 1  # ready, not built again
    assert cache.ensure(task, _Client(), None, multiplier) == image_name(task) and builds["started"] == 1


def test_a_failed_late_build_lets_the_next_reset_build_again(builds):
    cache, task = ImageCache(), load_task(TASKS / "hello-file")
    builds["fail"] = True
    with pytest.raises(HarborError, match="ran past build_timeout_sec"):
        cache.ensure(task, _Client(), None, 0.2 / 300)
    builds["release"].set()  # the first build fails after its timeout
    with pytest.raises(HarborError, match="failed: the Dockerfile's RUN failed"):
        cache.ensure(task, _Client(), None, 10 / 300)  # its lock is free again: a build of its own, failing too
    assert builds["started"] == 2
    builds["fail"] = False
    assert cache.ensure(task, _Client(), None, 10 / 300) == image_name(task) and builds["started"] == 3


class _Box:
    def __init__(self, code: int, out: str = "") -> None:
        self.code, self.out, self.argv = code, out, None

    def exec(self, argv, *, timeout_s=None, **kwargs):
        self.argv = list(argv)
        return ExecResult(command=tuple(argv), exit_code=self.code, stdout=self.out, stderr="", duration_s=0.1,
                          timed_out=False)


def test_an_agent_process_that_survives_its_kill_is_an_infrastructure_error():
    box = _Box(3, "still running after SIGKILL: 41 (writer)")
    with pytest.raises(HarborError, match=r"ending the agent's processes .* 41 \(writer\)") as info:
        stop_agent(box, "hello-file")
    assert isinstance(info.value, InfraError)
    assert box.argv[:3] == ["bash", "-c", runtime.STOP_AGENT_SCRIPT]
    stop_agent(_Box(0), "hello-file")  # none left: nothing to say
