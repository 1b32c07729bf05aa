"""``hub/Verifiers-v0`` as an env (``agentrl.hubs.verifiers_env``) without a hub venv: the id
is registered without importing verifiers, making the env starts nothing, its task env names
tasks, and its agent (one runner process per episode) is driven against a stand-in "python"
that answers as the runner would: the request it gets (the episode's gateway session), the
reward it hands back, a failure as an infrastructure error, and the process stopped when the
episode ends first (its stdin closed; killed if it ignores that)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import gymnasium
import pytest

import agentrl.hubs  # noqa: F401 - registers the hub/ ids
from agentrl.config import load_config
from agentrl.errors import ConfigError, EnvError, InfraError
from agentrl.gateway import AgentEnv
from agentrl.hubs import HUB_ENV_IDS
from agentrl.hubs import verifiers_env as ve
from agentrl.hubs.verifiers_env import ENV_ID, TASK_ENV_ID, VerifiersEnv, VerifiersTasks
from agentrl.hubs.verifiers_spec import VerifiersError, VerifiersSpec
from tests.helpers.run_async import run_async
from tests.unit.hubs.test_verifiers_spec import OK, fake_python

TASK = SimpleNamespace(task_id="train/2", shared_base_url="http://127.0.0.1:1/v1", session_id="gw0-abc",
                       api_key="sk-session")


def _env(python: str, **kwargs) -> VerifiersEnv:
    return gymnasium.make(ENV_ID, disable_env_checker=True, python=python, environment="some_env",
                          **kwargs).unwrapped


def test_the_id_is_registered_without_verifiers():
    assert HUB_ENV_IDS[ENV_ID] == "agentrl.hubs.verifiers_env:VerifiersEnv"
    assert gymnasium.spec(ENV_ID).entry_point == HUB_ENV_IDS[ENV_ID]
    assert TASK_ENV_ID in gymnasium.registry and "verifiers" not in sys.modules
    assert VerifiersEnv.serves_gateway and not VerifiersEnv.uses_sandbox and VerifiersEnv.sandbox_mounts() == ()


def test_making_the_env_starts_nothing(tmp_path):
    python = fake_python(tmp_path, "raise SystemExit(1)\n")
    env = _env(python, args={"n": 2}, split="test")
    assert isinstance(env, AgentEnv) and env.verifiers_spec.args == {"n": 2}
    assert isinstance(env.inner.unwrapped, VerifiersTasks) and env.inner.unwrapped.split == "test"
    assert not Path(python + ".req").exists()
    with pytest.raises(ConfigError, match="python=None"):
        gymnasium.make(ENV_ID, disable_env_checker=True, environment="x")
    with pytest.raises(ConfigError, match="split='dev'"):
        _env(python, split="dev")


def test_task_ids_come_from_the_runner_with_the_env_kwargs(tmp_path):
    python = fake_python(tmp_path, "print(json.dumps({'ok': True, 'count': 2}))\n")
    ids = VerifiersEnv.task_ids("test", env_kwargs={"python": python, "environment": "listed", "args": {"n": 1},
                                                    "split": "train"})
    assert ids == ["test/0", "test/1"]
    req = json.loads(Path(python + ".req").read_text())
    assert req["mode"] == "list" and req["split"] == "test" and req["args"] == {"n": 1}


def test_the_task_env_names_tasks_and_is_never_stepped(tmp_path):
    python = fake_python(tmp_path, "print(json.dumps({'ok': True, 'count': 3}))\n")
    tasks = VerifiersTasks(hub_kwargs={"python": python, "environment": "drawn"})
    obs, info = tasks.reset(options={"task_id": "test/1"})
    assert info == {"task_id": "test/1", "split": "test"} and "test/1" in obs
    _, info = tasks.reset(seed=0)
    assert info["task_id"] in ("train/0", "train/1", "train/2")
    with pytest.raises(ConfigError, match="not a hub/Verifiers-v0 task id"):
        tasks.reset(options={"task_id": "gsm8k/3"})
    with pytest.raises(EnvError, match="never stepped"):
        tasks.step("x")


def test_envs_check_checks_the_task_env_made_as_the_agent_makes_it(tmp_path):
    """``task_env_of`` (what ``agentrl envs check`` checks in the agent's place) gives the task
    env the kwargs an instance gives it, and the task env lists tasks with them; the checker
    passes on it without stepping it."""
    from environments.checker import check_env, format_report

    python = fake_python(tmp_path, "print(json.dumps({'ok': True, 'count': 2}))\n")
    kwargs = {"python": python, "environment": "checked", "split": "test", "tool_parser": "hermes"}
    task_env, task_kwargs = VerifiersEnv.task_env_of(kwargs)
    assert (task_env, task_kwargs) == (TASK_ENV_ID, {"hub_kwargs": {"python": python, "environment": "checked"},
                                                     "split": "test"})
    inner = gymnasium.make(ENV_ID, disable_env_checker=True, **kwargs).unwrapped.inner.unwrapped
    made = VerifiersTasks(**task_kwargs)
    assert (inner.split, inner.verifiers_spec) == (made.split, made.verifiers_spec) == ("test", made.verifiers_spec)
    assert VerifiersTasks.task_ids("test", env_kwargs=task_kwargs) == ["test/0", "test/1"]
    report = check_env(task_env, env_kwargs=task_kwargs, split="test")
    assert report.ok and report.task_id == "test/0" and report.steps == 0, format_report(report)


def test_the_agent_runs_one_runner_on_the_episode_session_and_returns_its_reward(tmp_path):
    python = fake_python(tmp_path, f"print({json.dumps(json.dumps(OK))})\n")
    env = _env(python, sampling={"max_tokens": 8})
    env.set_rollout(None, SimpleNamespace(temperature=1.0, top_p=1.0, top_k=-1), 24)
    assert run_async(env._run_rollout(TASK, None)) == 0.75
    req = json.loads(Path(python + ".req").read_text())
    assert req["mode"] == "rollout" and req["split"] == "train" and req["index"] == 2 and req["lifeline"]
    assert req["gateway"] == {"base_url": TASK.shared_base_url, "session_id": "gw0-abc", "api_key": "sk-session"}
    assert req["max_new_tokens"] == 24 and req["sampling"] == {"max_tokens": 8} and req["model"] == "agentrl-policy"
    assert env.result is not None and env.result.counters()["verifiers/reward/a"] == 1.0


def test_the_last_step_carries_verifiers_counters(tmp_path, monkeypatch):
    env = _env(fake_python(tmp_path, f"print({json.dumps(json.dumps(OK))})\n"))
    env.set_rollout(None, SimpleNamespace(temperature=1.0, top_p=1.0, top_k=-1), 16)
    run_async(env._run_rollout(TASK, None))
    monkeypatch.setattr(AgentEnv, "step", lambda self, a: ("", 0.75, True, False, {"counters": {"gateway/calls": 1.0}}))
    _, reward, terminated, _, info = env.step("x")
    assert reward == 0.75 and terminated and info["verifiers"] == {"stop": "max_turns_reached", "calls": 1,
                                                                   "api": "classic"}
    assert info["counters"] == {"gateway/calls": 1.0, "verifiers/reward/a": 1.0, "verifiers/reward/b": 0.5,
                                "verifiers/metric/num_turns": 1.0}
    monkeypatch.setattr(AgentEnv, "step", lambda self, a: ("next", 0.0, False, False, {}))
    assert env.step("x")[4] == {}  # a step in the middle of the episode: nothing added


@pytest.mark.parametrize("body, says", [
    ("print(json.dumps({'ok': False, 'error': 'the rollout failed: ModelError', 'config': False}))\n",
     "rollout of task 'train/2' of 'some_env' failed: the rollout failed: ModelError"),
    ("sys.stderr.write('Traceback: KeyError'); sys.exit(1)\n",
     "gave no answer .exit 1.; stderr: 'Traceback: KeyError'"),
    ("print(json.dumps({'ok': True, 'reward': None, 'rewards': {}}))\n", "not a result"),
])
def test_a_runner_failure_is_an_infrastructure_error_never_a_score(tmp_path, body, says):
    env = _env(fake_python(tmp_path, body))
    with pytest.raises(VerifiersError, match=says) as err:
        run_async(env._run_rollout(TASK, None))
    assert isinstance(err.value, InfraError) and env.result is None


def test_a_missing_python_names_the_script(tmp_path):
    env = _env(str(tmp_path / "nope" / "python"))
    with pytest.raises(VerifiersError, match="scripts/hub_venvs.sh"):
        run_async(env._run_rollout(TASK, None))


async def _cancel_when_started(env: VerifiersEnv, marker: Path) -> None:
    task = asyncio.ensure_future(env._run_rollout(TASK, None))
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_an_episode_that_ends_first_closes_the_runner_stdin(tmp_path):
    marker = tmp_path / "started"
    done = tmp_path / "saw-eof"
    python = fake_python(tmp_path, f"open({str(marker)!r}, 'w').close()\nsys.stdin.read()\n"
                                   f"open({str(done)!r}, 'w').close()\n")
    run_async(_cancel_when_started(_env(python), marker))
    assert done.exists()  # the runner saw its stdin end and stopped by itself


def test_a_runner_that_ignores_its_stdin_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(ve, "STOP_GRACE_S", 0.3)
    marker, pid_file = tmp_path / "started", tmp_path / "pid"
    python = fake_python(tmp_path, f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                                   f"open({str(marker)!r}, 'w').close()\ntime.sleep(60)\n")
    t0 = time.monotonic()
    run_async(_cancel_when_started(_env(python), marker))
    assert time.monotonic() - t0 < 20
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.parametrize("name, venv", [("verifiers_v1.yaml", "verifiers-0.4.0"),
                                        ("verifiers_classic.yaml", "verifiers-0.3.1")])
def test_the_examples_load_and_name_a_hub_venv_and_a_helper_env(name, venv, monkeypatch):
    repo = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(repo)  # python_path is relative to the repository root, where the examples run
    cfg = load_config(repo / "examples" / name)
    assert cfg.env.id == ENV_ID
    spec = VerifiersSpec.from_kwargs(cfg.env.kwargs)
    assert spec.python.endswith(f"hub-venvs/{venv}/bin/python")
    assert (Path(spec.python_path[0]) / f"{spec.environment}.py").is_file()
