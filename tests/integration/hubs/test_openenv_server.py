"""``hub/OpenEnv-v0`` against real OpenEnv servers: the game of
tests/helpers/openenv_guess_server.py served by openenv 0.10.0 from the hub venv
(scripts/hub_venvs.sh; openenv is never imported here). Episodes over /ws, the env checker,
one server per episode for a server that refuses concurrent sessions, and no session (nor
server) left after the process holding it is SIGKILLed and the reaper runs, as at the next start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agentrl.hubs.openenv import ENV_ID, OpenEnvEnv
from agentrl.hubs.openenv_servers import stop_servers
from environments.checker import check_env
from sandboxes import reap_orphans
from sandboxes.reaper import reaper_lock
from tests.helpers.openenv_hub import guess_command, guess_server, open_sessions, pid_alive, wait_for

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _stop_all():
    yield
    stop_servers()


def test_an_episode_over_ws_with_json_actions_and_per_step_rewards():
    with guess_server(max_sessions=2, action="int") as (url, _):
        env = OpenEnvEnv(server=url, anchor_fields=["low", "high"])
        obs, info = env.reset(options={"task_id": "openenv/3"})  # random.Random(3) draws 8 from 1..16
        assert json.loads(obs) == {"feedback": "Guess the secret number from 1 to 16.", "low": 1, "high": 16}
        assert '"guess"' in info["system_prompt"] and info["metadata"] == {"guesses": []}
        assert open_sessions(url) == 1
        steps = [env.step(a) for a in ('{"guess": 4}', "eight", '```json\n{"guess": 12}\n```', '{"guess": 8}')]
        assert [s[1] for s in steps] == [0.1, 0.0, 0.1, 1.0]  # useful guess, invalid, useful, right
        assert [s[4]["invalid_action"] for s in steps] == [False, True, False, False]
        assert [s[4]["anchor"][1] for s in steps] == ['{"high": 16, "low": 5}'] * 2 + ['{"high": 11, "low": 5}'] * 2
        assert steps[-1][2] and steps[-1][4]["metadata"] == {"guesses": [4, 12, 8]}
        wait_for(lambda: open_sessions(url) == 0, 10, "the session to close with its episode")
        env.close()


def test_the_env_checker_passes_on_a_real_server():
    with guess_server(max_sessions=4, action="text") as (url, _):
        report = check_env(ENV_ID, env_kwargs={"server": url}, task_id="openenv/3",
                           scripted_actions=["1", "2", "8", "3", "4"])
        report.raise_if_failed()
        wait_for(lambda: open_sessions(url) == 0, 10, "every session to close")


def test_the_env_checker_passes_on_a_shared_server_it_started():
    """A started server that takes concurrent sessions is shared and outlives its episodes by
    idle_s; the checker's close check counts it released after OpenEnvEnv.release_shared (the
    server is this process's child: a live one would be a leak)."""
    server = {"command": guess_command(max_sessions=4), "idle_s": 600}
    report = check_env(ENV_ID, env_kwargs={"server": server}, task_id="openenv/3",
                       scripted_actions=["1", "2", "8", "3", "4"])
    report.raise_if_failed()
    assert "close" in report.checks_passed


def test_a_server_that_refuses_concurrent_sessions_gets_one_server_per_episode():
    server = {"command": guess_command(max_sessions=1), "idle_s": 0}
    envs = [OpenEnvEnv(server=server), OpenEnvEnv(server=server)]
    errors: list[BaseException] = []
    threads = [threading.Thread(target=lambda e=e, i=i: _reset(e, i, errors)) for i, e in enumerate(envs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    pids = [e.server_pid for e in envs]
    assert None not in pids and pids[0] != pids[1]
    for env, pid in zip(envs, pids):  # four guesses end an episode, and its server with it
        for guess in ("1", "2", "3", "4"):
            _, _, terminated, _, _ = env.step(guess)
            if terminated:
                break
        assert not pid_alive(pid)
    envs[0].reset(options={"task_id": "openenv/5"})  # the next episode: a server of its own again
    assert envs[0].server_pid not in pids
    envs[0].close()
    envs[1].close()
    # a server that serves concurrent sessions is shared by the episodes
    shared = [OpenEnvEnv(server={"command": guess_command(max_sessions=4), "idle_s": 0}) for _ in range(2)]
    for i, env in enumerate(shared):
        env.reset(options={"task_id": f"openenv/{i}"})
    assert shared[0].server_pid == shared[1].server_pid and open_sessions(shared[0].base_url) == 2
    for env in shared:
        env.close()


def _reset(env, i, errors):
    try:
        env.reset(options={"task_id": f"openenv/{i}"})
    except BaseException as exc:
        errors.append(exc)


_HOLDER = """
import json, sys, time
from agentrl.hubs.openenv import OpenEnvEnv
named = OpenEnvEnv(server=sys.argv[1])
named.reset(options={"task_id": "openenv/1"})
started = OpenEnvEnv(server={"command": json.loads(sys.argv[2]), "run_id": sys.argv[3]})
started.reset(options={"task_id": "openenv/2"})
print(json.dumps({"pid": started.server_pid, "url": started.base_url}), flush=True)
time.sleep(600)
"""


def test_no_session_or_server_is_left_after_a_sigkill_and_restart(tmp_path):
    run_id = f"openenv-kill-{os.getpid()}"
    with guess_server(max_sessions=1) as (url, _):
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, url, json.dumps(guess_command(1)), run_id],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = holder.stdout.readline()
            assert line, holder.stderr.read()[-3000:]
            held = json.loads(line)
            assert open_sessions(url) == 1 and open_sessions(held["url"]) == 1
            assert reap_orphans(run_id) == 0 and pid_alive(held["pid"])  # its owner runs: not an orphan
        finally:
            with reaper_lock():  # no other process's reaper takes the orphan before this test looks
                holder.send_signal(signal.SIGKILL)
                holder.wait(30)
                # the sockets died with their process: both servers closed the sessions
                wait_for(lambda: open_sessions(url) == 0, 30, "the named server to close the dead process's session")
                wait_for(lambda: open_sessions(held["url"]) == 0, 30, "the started server to close its session")
                # the restart: what `agentrl train` runs first removes the orphaned server
                assert pid_alive(held["pid"])
                assert reap_orphans(run_id) >= 1
        wait_for(lambda: not pid_alive(held["pid"]) or _zombie(held["pid"]), 10, "the orphaned server to die")
        # the named server, which serves one session at a time, takes a new one
        env = OpenEnvEnv(server=url, session_wait_s=5)
        env.reset(options={"task_id": "openenv/3"})
        env.close()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False
