"""``agentrl replay rerun`` on real environments in the real bubblewrap sandbox.

The episodes are recorded the way the rollout loop records them (reset with the episode's
seed and task, the anchor before each action, each step's observation and reward), from a
real environment and a real sandbox, and written by the replay store's writer with the run's
config. The rerun then makes a fresh environment and sandbox from that config:

* ``agentrl/ShellTasks-v0`` solved with its reference solution reruns with no difference
  (exit 0);
* a test-only environment that puts the sandbox's clock into the observation of turn 2
  reports turn 2 with the diff (exit 1);
* an unknown episode, an environment no longer registered and a sandbox that cannot start
  are errors (exit 2), never divergences.
"""

from __future__ import annotations

import json
import shutil

import gymnasium
import pytest
from typer.testing import CliRunner

import environments
from agentrl.cli import app
from agentrl.commands.rerun import rerun_stored_episode
from agentrl.config import load_default_config
from agentrl.replay import ReplayStore
from agentrl.types import Episode, StepInfo, TerminationReason, Turn
from environments.core import TextEnv
from environments.shell_tasks import get_task
from sandboxes import SandboxSpec, make_sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

CLOCK_ENV = "agentrl_test/ClockAtTurn2-v0"
RUN_ID = "rerun-test-0123abcd"


class ClockAtTurn2Env(TextEnv):
    """Runs each action as a shell command in its sandbox and returns its output; the
    observation of turn 2 (0-based) also holds the sandbox's clock in nanoseconds, so no two
    episodes agree there. Four turns, reward = the turn number."""

    def __init__(self, sandbox=None):
        super().__init__()
        self.sandbox = sandbox
        self._turn = 0

    @classmethod
    def task_ids(cls, split="train"):
        return ["clock/0"]

    def reset(self, *, seed=None, options=None):
        self._task_id = self._start_reset(seed, options) or "clock/0"
        self._turn, self._done = 0, False
        return f"Task {self._task_id}: run the commands you are given.", {}

    def step(self, action):
        self._check_step(action)
        out = self.sandbox.exec(action, timeout_s=30).stdout
        if self._turn == 2:
            out += "clock: " + self.sandbox.exec("date +%s%N", timeout_s=30).stdout
        reward = float(self._turn)
        self._turn += 1
        self._done = self._turn >= 4
        return out, reward, self._done, False, {}


@pytest.fixture(scope="module", autouse=True)
def clock_env():
    gymnasium.register(id=CLOCK_ENV, entry_point=ClockAtTurn2Env)
    yield
    gymnasium.registry.pop(CLOCK_ENV, None)


def record(env_id: str, task_id: str, actions: list[str], episode_id: str, seed: int = 3) -> Episode:
    """One episode of ``env_id`` with ``actions``, in a real bwrap sandbox, recorded as the
    rollout loop records it (token ids are placeholders: a rerun reads only the text)."""
    sandbox = make_sandbox("bwrap", SandboxSpec(run_id="test-rerun-record"))
    env = environments.make_env(env_id, sandbox=sandbox)
    try:
        obs, info = env.reset(seed=seed, options={"task_id": task_id})
        anchor = StepInfo.from_info(info, env_id=env_id, where="reset").anchor_or(obs)
        turns, reason = [], TerminationReason.MAX_TURNS
        for k, action in enumerate(actions):
            obs, reward, terminated, truncated, info = env.step(action)
            turns.append(Turn(prompt_ids=[10 + k, 11 + k], completion_ids=[20 + k, 21 + k], behavior_log_probs=[-0.5, -0.25],
                              anchor=anchor, action_text=action, observation_text=obs, reward=float(reward)))
            anchor = StepInfo.from_info(info, env_id=env_id, where="step").anchor_or(obs)
            if terminated or truncated:
                reason = TerminationReason.ENV_TERMINATED if terminated else TerminationReason.ENV_TRUNCATED
                assert k == len(actions) - 1, f"{env_id} ended at turn {k}, before the last action"
                break
        return Episode(group_id=f"{task_id}@0", env_id=env_id, task_id=task_id, seed=seed, turns=turns,
                       terminated=reason == TerminationReason.ENV_TERMINATED,
                       truncated=reason == TerminationReason.ENV_TRUNCATED, termination_reason=reason,
                       episode_id=episode_id)
    finally:
        env.close()
        sandbox.close()


def bash(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory whose replay.db holds a solved ShellTasks episode and a ClockAtTurn2
    episode, under a run whose config names the bwrap backend, stored as a training run's first
    iteration (iteration 1, ids ``{run}/it1/...``)."""
    d = tmp_path_factory.mktemp("rerun-run")
    cfg = load_default_config(["env.id=agentrl/ShellTasks-v0", "sandbox.backend=bwrap", "sandbox.pool_size=2",
                               "rollout.max_turns=4", f"run.dir={d}"])
    shell = record("agentrl/ShellTasks-v0", "shell/count_lines",
                   [bash(get_task("shell/count_lines").solution), "Done."], f"{RUN_ID}/it1/shell/count_lines@0/0/a0")
    clock = record(CLOCK_ENV, "clock/0", ["echo one", "echo two", "echo three", "echo four"],
                   f"{RUN_ID}/it1/clock/0@0/0/a0")
    assert shell.turns[-1].reward == 1.0 and shell.termination_reason == TerminationReason.ENV_TERMINATED
    with ReplayStore(f"sqlite:///{d / 'replay.db'}") as store:
        store.start_run(RUN_ID, cfg.model_dump(mode="json"))
        store.add_episodes(RUN_ID, 1, [shell, clock])  # a training run's first iteration (ids it1)
    return d


def invoke(*args: str):
    return CliRunner().invoke(app, ["replay", "rerun", *args], catch_exceptions=False)


def reruns(run_dir, episode_id):
    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:
        return store.reruns(episode_id)


def test_a_deterministic_episode_reruns_the_same(run_dir):
    episode_id = f"{RUN_ID}/it1/shell/count_lines@0/0/a0"
    res = invoke(episode_id, "--db", str(run_dir))
    assert res.exit_code == 0, res.output
    assert "same: all 2 turns give the recorded observation and reward" in res.output
    assert "bwrap" in res.output  # the run's backend, from its stored config
    stored = reruns(run_dir, episode_id)
    assert stored and stored[0].same is True and stored[0].first_divergent_turn is None
    assert [t["status"] for t in stored[0].report["turns"]] == ["same", "same"]


def test_an_environment_nondeterministic_at_turn_2_is_reported_at_turn_2(run_dir):
    episode_id = f"{RUN_ID}/it1/clock/0@0/0/a0"
    res = invoke(episode_id, "--db", str(run_dir))
    assert res.exit_code == 1, res.output
    assert "first divergence at turn 2" in res.output
    assert "turn 2: observation differs" in res.output
    report = reruns(run_dir, episode_id)[0]
    assert report.same is False and report.first_divergent_turn == 2
    turns = report.report["turns"]
    assert [t["status"] for t in turns[:2]] == ["same", "same"]  # turns 0 and 1 replay exactly
    obs = next(f for f in turns[2]["fields"] if f["field"] == "observation")
    assert obs["diff"].startswith("--- recorded\n+++ rerun\n")
    minus = [ln for ln in obs["diff"].splitlines() if ln.startswith("-clock: ")]
    plus = [ln for ln in obs["diff"].splitlines() if ln.startswith("+clock: ")]
    assert len(minus) == len(plus) == 1 and minus[0][1:] in turns[2]["fields"][0]["recorded"] and minus != plus
    assert [f["field"] for f in turns[2]["fields"]] == ["observation"]  # reward and end flags agree
    assert [f["field"] for f in turns[3]["fields"]] == ["state"]  # turn 3 starts from turn 2's observation


def test_unknown_episode_and_unregistered_env_are_errors_not_divergences(run_dir):
    res = invoke(f"{RUN_ID}/it1/nope@0/0/a0", "--db", str(run_dir))
    assert res.exit_code == 2 and "is not in" in res.output, res.output
    spec = gymnasium.registry.pop(CLOCK_ENV)
    try:
        res = invoke(f"{RUN_ID}/it1/clock/0@0/0/a0", "--db", str(run_dir), "--no-record")
    finally:
        gymnasium.registry[CLOCK_ENV] = spec
    assert res.exit_code == 2 and "is not registered" in res.output, res.output
    res = invoke(f"{RUN_ID}/it1/clock/0@0/0/a0", "--db", str(run_dir / "missing"))
    assert res.exit_code == 2 and "does not exist" in res.output, res.output


def test_a_sandbox_that_fails_is_an_infrastructure_error(run_dir, monkeypatch):
    """A sandbox whose commands fail (bwrap refuses a command over its limits: here a
    sandbox ``exec`` that the backend reports as an InfraError) ends the rerun with outcome
    ``error`` and exit 2, and the stored result says so (same is NULL)."""
    from sandboxes import bwrap

    real_exec = bwrap.BwrapSandbox.exec

    def exec_fails_at_turn_1(self, command, *a, **kw):
        if command == "echo two":
            raise bwrap.SandboxError(f"sandbox lost while running {command!r}")
        return real_exec(self, command, *a, **kw)

    monkeypatch.setattr(bwrap.BwrapSandbox, "exec", exec_fails_at_turn_1)
    episode_id = f"{RUN_ID}/it1/clock/0@0/0/a0"
    report = rerun_stored_episode(run_dir, episode_id)
    assert report.outcome == "error" and report.exit_code == 2
    assert report.error["kind"] == "infrastructure" and report.error["turn_index"] == 1
    assert [t.status for t in report.turns] == ["same", "error", "not_reached", "not_reached"]
    assert reruns(run_dir, episode_id)[0].same is None


def test_an_eval_episode_reruns_with_the_config_its_eval_run_wraps(tmp_path):
    """``agentrl eval`` stores ``{"kind": "eval", ..., "config": {...}}`` as its run's config."""
    cfg = load_default_config(["env.id=agentrl/ShellTasks-v0", "sandbox.backend=bwrap"])
    episode = record("agentrl/ShellTasks-v0", "shell/count_lines", [bash(get_task("shell/count_lines").solution)],
                     "eval-run/it0/shell/count_lines@0/0/a0")
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("eval-run", {"kind": "eval", "target": "runs/x", "eval": {"samples": 1},
                                     "config": cfg.model_dump(mode="json")})
        store.add_episodes("eval-run", 0, [episode])  # agentrl eval's rows: iteration 0 (ids it0)
    report = rerun_stored_episode(tmp_path, episode.episode_id, record=False)
    assert report.outcome == "same" and report.backend == "bwrap", report


def test_rerun_through_a_database_url(db_url):
    """``--db`` as a URL: the SQLite file's URL, and PostgreSQL where the suite has a server
    (``$AGENTRL_TEST_POSTGRES_URL``); the result lands in that database's reruns table."""
    cfg = load_default_config(["env.id=agentrl/ShellTasks-v0", "sandbox.backend=bwrap"])
    episode = record("agentrl/ShellTasks-v0", "shell/uppercase", [bash(get_task("shell/uppercase").solution), "Done."],
                     f"{RUN_ID}/it1/shell/uppercase@0/0/a0", seed=5)
    with ReplayStore(db_url) as store:
        store.start_run(RUN_ID, cfg.model_dump(mode="json"))
        store.add_episodes(RUN_ID, 1, [episode])  # a training run's first iteration (id it1)
    report = rerun_stored_episode(db_url, episode.episode_id)
    assert report.outcome == "same" and [t.status for t in report.turns] == ["same", "same"], report
    with ReplayStore(db_url) as store:
        (stored,) = store.reruns(episode.episode_id)
    assert stored.same is True and stored.report["outcome"] == "same" and stored.report["backend"] == "bwrap"
