"""Every built-in environment passes ``environments.checker.check_env`` with real
bubblewrap sandboxes (the checker makes two instances, each with its own sandbox), and
Gymnasium's own ``gymnasium.utils.env_checker.check_env`` (close and render checks
included: they re-make the env from its spec, sharing the caller's sandbox)."""

from __future__ import annotations

import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

import environments
from environments.checker import check_env, format_report
from sandboxes import SandboxSpec, make_sandbox


def bwrap_factory():
    return make_sandbox("bwrap", SandboxSpec(run_id="test-env-checker", memory_mb=1024))


@pytest.mark.parametrize("env_id", environments.registered_env_ids())
def test_builtin_env_passes_the_checker(env_id, tmp_path_factory, monkeypatch):
    if env_id == "agentrl/TextWorld-v0":
        pytest.importorskip("textworld")
        monkeypatch.setenv("AGENTRL_TEXTWORLD_CACHE", str(tmp_path_factory.mktemp("textworld")))
    made = []

    def factory():
        made.append(bwrap_factory())
        return made[-1]

    report = check_env(env_id, sandbox_factory=factory)
    assert report.ok, format_report(report)
    assert "done" in report.checks_passed and "close" in report.checks_passed
    assert len(made) == 2 and all(sb.closed for sb in made)  # the checker closed what it got


@pytest.mark.parametrize("env_id", environments.registered_env_ids())
def test_builtin_env_passes_gymnasiums_own_checker(env_id, tmp_path_factory, monkeypatch):
    if env_id == "agentrl/TextWorld-v0":
        pytest.importorskip("textworld")
        monkeypatch.setenv("AGENTRL_TEXTWORLD_CACHE", str(tmp_path_factory.mktemp("textworld")))
    sandbox = bwrap_factory()
    try:
        env = gymnasium.make(env_id, sandbox=sandbox)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gymnasium_check_env(env.unwrapped)
        env.close()
        # Only the render-fps notice of the envs with an "ansi" mode is acceptable.
        other = [str(w.message) for w in caught if "render fps" not in str(w.message)]
        assert not other, other
        assert env.unwrapped.spec.kwargs["sandbox"] is sandbox
        assert not sandbox.closed  # the env and its re-made copies never close the caller's sandbox
    finally:
        sandbox.close()
