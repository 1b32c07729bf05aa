"""``environments.checker.check_env`` on a correct env and on deliberately broken ones: each
broken env fails with a problem naming what is wrong."""

from __future__ import annotations

import os
import random
import tempfile
import threading

import gymnasium
import numpy as np
import pytest

from agentrl.errors import EnvError
from environments.checker import CheckReport, EnvCheckError, check_env, format_report


class GoodEnv(gymnasium.Env):
    """Guess a number drawn from the seed; ends at the second step."""

    def __init__(self, sandbox=None):
        self._t = None

    @classmethod
    def task_ids(cls, split="train"):
        return ["t0", "t1"]

    @classmethod
    def checker_actions(cls):
        return ["1", "2"]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._n = int(self.np_random.integers(100))
        self._t = 0
        return f"guess {self._n % 7}", {"anchor": ("start",)}

    def step(self, action):
        if self._t is None or self._t >= 2:
            raise EnvError("step after the episode ended")
        self._t += 1
        noise = int(self.np_random.integers(1000))
        return f"noise {noise}", 0.5, self._t >= 2, False, {"anchor": (self._t,)}


class NondeterministicReset(GoodEnv):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return f"start {os.urandom(4).hex()}", {"anchor": ("start",)}


class UnhashableAnchor(GoodEnv):
    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        info["anchor"] = [self._t]
        return obs, r, term, trunc, info


class StepAfterDoneAccepted(GoodEnv):
    def step(self, action):
        self._t = (self._t or 0) + 1
        return "ok", 0.0, self._t >= 2, False, {"anchor": (self._t,)}


class LeaksResources(GoodEnv):
    made: list["LeaksResources"] = []  # so the test can clean up after the checker

    def __init__(self, sandbox=None):
        super().__init__(sandbox)
        LeaksResources.made.append(self)
        self._file = tempfile.TemporaryFile()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._stop.wait, name="leaky-worker", daemon=True)
        self._thread.start()

    def close(self):  # forgets to close the file and stop the thread
        pass

    def really_close(self):
        self._stop.set()
        self._file.close()


class SharedGlobalRandom(GoodEnv):
    def reset(self, *, seed=None, options=None):
        random.seed(seed)
        self._t = 0
        return f"start {random.randint(0, 9)}", {"anchor": ("start",)}

    def step(self, action):
        if self._t is None or self._t >= 2:
            raise EnvError("step after the episode ended")
        self._t += 1
        return f"draw {random.randint(0, 10**6)}", 0.0, self._t >= 2, False, {"anchor": (self._t,)}


class BadTypes(GoodEnv):
    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, float("nan"), int(term), trunc, info


class BadObservationRole(GoodEnv):
    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        info["observation_role"] = "assistant"
        return obs, r, term, trunc, info


class BadToolSchema(GoodEnv):
    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["tools"] = [{"type": "function", "function": {"name": "python", "parameters": "oops"}}]
        return obs, info


class NumpyBoolFlags(GoodEnv):
    """``info["success"] = reward >= 1.0`` with a numpy reward gives ``np.True_``: fine."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        info["success"] = np.float64(r) >= 1.0
        info["invalid_action"] = np.False_
        return obs, r, term, trunc, info


BROKEN = {
    "BadToolSchema": (BadToolSchema, "reset", r"info\['tools'\].*has parameters of type str, not a dict"),
    "BadObservationRole": (BadObservationRole, "step", "observation_role.*'assistant'"),
    "NondeterministicReset": (NondeterministicReset, "determinism", "different"),
    "UnhashableAnchor": (UnhashableAnchor, "anchor", "not hashable"),
    "StepAfterDoneAccepted": (StepAfterDoneAccepted, "done", "was accepted"),
    "LeaksResources": (LeaksResources, "close", "file descriptor.*leaky-worker"),
    "SharedGlobalRandom": (SharedGlobalRandom, "independence", "share random state"),
    "BadTypes": (BadTypes, "step", "reward=nan"),
}


@pytest.fixture(scope="module", autouse=True)
def registered():
    ids = []
    for name, cls in [("Good", GoodEnv), ("NumpyBoolFlags", NumpyBoolFlags)] + [(n, c) for n, (c, _, _) in BROKEN.items()]:
        env_id = f"checkertest/{name}-v0"
        gymnasium.register(id=env_id, entry_point=cls)
        ids.append(env_id)
    yield
    for env_id in ids:
        gymnasium.registry.pop(env_id, None)


def test_a_correct_env_passes_every_check():
    report = check_env("checkertest/Good-v0")
    assert report.ok, format_report(report)
    assert report.checks_passed == [
        "task_ids", "make", "reset", "step", "done", "determinism", "independence", "close"
    ]
    assert report.task_id == "t0" and report.steps == 2
    report.raise_if_failed()
    assert "PASS" in format_report(report)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_env_fails_with_a_message_naming_the_problem(name):
    cls, check, pattern = BROKEN[name]
    report = check_env(f"checkertest/{name}-v0")
    try:
        assert not report.ok
        assert check in {p.check for p in report.problems}, format_report(report)
        msg = " ".join(p.message for p in report.problems if p.check == check)
        assert __import__("re").search(pattern, msg), msg
        with pytest.raises(EnvCheckError) as info:
            report.raise_if_failed()
        assert isinstance(info.value, EnvError) and f"FAIL  {check}" in str(info.value)
    finally:
        while LeaksResources.made:
            LeaksResources.made.pop().really_close()


def test_numpy_bool_flags_pass():
    report = check_env("checkertest/NumpyBoolFlags-v0")
    assert report.ok, format_report(report)


def test_actions_that_do_not_end_the_episode_are_noted_not_failed():
    report = check_env("checkertest/Good-v0", scripted_actions=["1"])
    assert report.ok and "done" not in report.checks_passed
    assert any("did not end the episode" in n for n in report.notes)


def test_an_unregistered_id_is_a_make_problem():
    report = check_env("checkertest/Missing-v0")
    assert [p.check for p in report.problems] == ["make"]
    assert "not registered" in report.problems[0].message


def test_the_demo_package_env_passes(monkeypatch):
    from pathlib import Path

    from environments import registry

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "fixtures" / "envpkg"))
    try:
        report = check_env("demo/Echo-v0")
        assert report.ok, format_report(report)
    finally:
        gymnasium.registry.pop("demo/Echo-v0", None)
        registry._loaded_entry_points.discard(("agentrl-demo-envs", "demo"))
    assert isinstance(report, CheckReport)


class _SharedWorkerEnv(GoodEnv):
    """Its instances share one thread of the process, started by the first reset and kept
    after close (as a scoring worker or a shared server is)."""

    shared: dict = {"thread": None, "stop": None}

    def reset(self, *, seed=None, options=None):
        if self.shared["thread"] is None:
            stop = threading.Event()
            self.shared["stop"] = stop
            self.shared["thread"] = threading.Thread(target=stop.wait, name="shared-worker", daemon=True)
            self.shared["thread"].start()
        return super().reset(seed=seed, options=options)

    @classmethod
    def stop_shared(cls):
        if cls.shared["thread"] is not None:
            cls.shared["stop"].set()
            cls.shared["thread"].join()
            cls.shared["thread"] = None


class _ReleasesShared(_SharedWorkerEnv):
    shared = {"thread": None, "stop": None}
    released = 0

    @classmethod
    def release_shared(cls):
        cls.released += 1
        cls.stop_shared()


class _KeepsShared(_SharedWorkerEnv):
    shared = {"thread": None, "stop": None}


def test_what_instances_share_counts_as_released_after_release_shared_and_leaked_without_it():
    for cls in (_ReleasesShared, _KeepsShared):
        gymnasium.register(id=f"checkertest/{cls.__name__}-v0", entry_point=cls)
    try:
        report = check_env("checkertest/_ReleasesShared-v0")
        assert report.ok, format_report(report)
        assert _ReleasesShared.shared["thread"] is None and _ReleasesShared.released >= 1
        kept = check_env("checkertest/_KeepsShared-v0")
        assert [p.check for p in kept.problems] == ["close"], format_report(kept)
        assert "1 thread(s) still running: shared-worker" in kept.problems[0].message
    finally:
        _KeepsShared.stop_shared()
        for cls in (_ReleasesShared, _KeepsShared):
            gymnasium.registry.pop(f"checkertest/{cls.__name__}-v0", None)


def test_an_env_that_is_never_stepped_says_so():
    report = check_env("checkertest/Good-v0", scripted_actions=[])
    assert report.ok and report.steps == 0 and "step" not in report.checks_passed
    assert any("never stepped" in n for n in report.notes), report.notes
