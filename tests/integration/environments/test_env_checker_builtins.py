"""Every built-in environment passes ``environments.checker.check_env`` with real
bubblewrap sandboxes (the checker makes two instances, each with its own sandbox)."""

from __future__ import annotations

import pytest

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
