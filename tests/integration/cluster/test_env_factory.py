"""``EnvFactory``: the sandbox backend is chosen once per run, and environments that
declare ``uses_sandbox = False`` get no sandbox (none is started for them)."""

from __future__ import annotations

import pytest

import sandboxes
from agentrl.cluster.actors.env_factory import EnvFactory
from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.types import EpisodeRequest


def _cfg(env_id: str, backend: str = "bwrap", **extra: str):
    return load_config(None, [f"env.id={env_id}", f"sandbox.backend={backend}"]
                       + [f"{k}={v}" for k, v in extra.items()])


def _req(env_id: str, task_id: str):
    return EpisodeRequest(env_id=env_id, task_id=task_id, seed=0, group_id="g", sample_seed=0)


def test_in_process_envs_get_no_sandbox():
    for env_id, task in (("agentrl/Sokoban-v0", "sokoban/0"), ("agentrl/GuessNumber-v0", "guess/0")):
        factory = EnvFactory(_cfg(env_id), "run-factory-test")
        env, sandbox = factory(_req(env_id, task))
        try:
            assert sandbox is None and factory.backend is None and factory.pool is None
            assert env.reset(options={"task_id": task})[0]
        finally:
            env.close()


def test_sandboxed_env_gets_a_real_bwrap_sandbox():
    factory = EnvFactory(_cfg("agentrl/ShellTasks-v0"), "run-factory-test")
    env, sandbox = factory(_req("agentrl/ShellTasks-v0", "shell/rename_ext"))
    try:
        assert factory.backend == "bwrap"
        assert isinstance(sandbox, sandboxes.BwrapSandbox)
        assert sandbox.exec("echo hi").stdout.strip() == "hi"
    finally:
        env.close()
        sandbox.close()


def test_auto_is_resolved_once_per_run(monkeypatch, tmp_path):
    calls = []
    choose = sandboxes.choose_sandboxes

    def counted(*a, **k):
        calls.append(1)
        return choose(*a, **k)

    # no daemon named, none started by agentrl, none at the default socket: bubblewrap
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv(sandboxes.docker.daemon.DOCKERD_STATE_VAR, str(tmp_path / "no-state.json"))
    monkeypatch.setattr(sandboxes.docker.daemon, "DOCKER_SOCKET", str(tmp_path / "no-daemon.sock"))
    monkeypatch.setattr(sandboxes, "choose_sandboxes", counted)
    factory = EnvFactory(_cfg("agentrl/ShellTasks-v0", "auto"), "run-factory-test")
    made = [factory(_req("agentrl/ShellTasks-v0", "shell/rename_ext")) for _ in range(3)]
    try:
        assert factory.backend == "bwrap" and len(calls) == 1
        assert all(isinstance(sb, sandboxes.BwrapSandbox) for _, sb in made)
    finally:
        for env, sb in made:
            env.close()
            sb.close()


def test_choose_backend_names_its_reason(monkeypatch, tmp_path):
    assert sandboxes.choose_backend("bwrap", "any") == ("bwrap", "bwrap: named in the config (sandbox.backend)")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv(sandboxes.docker.daemon.DOCKERD_STATE_VAR, str(tmp_path / "no-state.json"))
    monkeypatch.setattr(sandboxes.docker.daemon, "DOCKER_SOCKET", str(tmp_path / "no-daemon.sock"))
    backend, why = sandboxes.choose_backend("auto", "any")
    assert (backend, why.split(" (")[0]) == ("bwrap", "bwrap: no Docker daemon named")
    with pytest.raises(ConfigError, match="'podman'"):
        sandboxes.choose_backend("podman", "any")
