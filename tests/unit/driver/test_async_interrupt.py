"""The async driver leaves at once on an interrupt while the trainer step runs in its
background thread (``agentrl.driver.stream_source.step_while_pumping``). End to end (a
SIGTERM to ``agentrl train`` mid-update, the run marked interrupted, the resume training every
task instance once): ``tests/integration/cluster/test_async_train.py``'s chaos test."""

from __future__ import annotations

import threading
import time

import pytest

from agentrl.driver.stream_source import in_background, step_while_pumping


def test_an_interrupt_while_the_step_runs_propagates_without_waiting_for_it():
    release = threading.Event()
    started = threading.Event()

    def step():  # a trainer step that takes far longer than the test
        started.set()
        release.wait(60)
        return {"loss": 1.0}

    calls = []

    def pump(wait_s):
        calls.append(wait_s)
        time.sleep(0.01)
        if len(calls) == 3:
            raise KeyboardInterrupt  # what train()'s SIGTERM handler raises

    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        step_while_pumping(step, (), pump)
    assert time.perf_counter() - t0 < 2.0 and started.is_set() and not release.is_set()
    (worker,) = [t for t in threading.enumerate() if t.name == "agentrl-update"]
    assert worker.daemon  # the interpreter does not wait for it at exit
    release.set()
    worker.join(5)
    assert not worker.is_alive()


def test_the_step_result_and_its_error_come_back():
    pumped = []
    assert step_while_pumping(lambda a, b: a + b, (2, 3), lambda s: pumped.append(s)) == 5
    hook = []
    with pytest.raises(ValueError, match="boom"):
        step_while_pumping(lambda: (_ for _ in ()).throw(ValueError("boom")), (), pumped.append,
                           after_submit=lambda: hook.append(1))
    assert hook == [1]
    fut = in_background(lambda: 7)
    assert fut.result(5) == 7
