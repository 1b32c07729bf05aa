"""The hub envs' metadata (``agentrl.hubs.HUB_ENVS``) and ``agentrl envs list``: each hub id is
listed with its hub, what it needs and whether that is here (found without importing a hub
package); every hub example config loads and names its env, and the docs index
(docs/hubs/README.md) names every id, page and example."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import gymnasium
import pytest
import yaml
from typer.testing import CliRunner

import agentrl.hubs  # noqa: F401 - registers the hub/ ids
from agentrl.cli import app
from agentrl.cli.maintenance import hub_need_here
from agentrl.config import load_config
from agentrl.hubs import HUB_ENV_IDS, HUB_ENVS

REPO = Path(__file__).resolve().parents[3]
SOURCES = {
    "hub/ReasoningGym-v0": "hub: reasoning-gym (extra reasoning-gym)",
    "hub/OpenEnv-v0": "hub: OpenEnv (extra openenv)",
    "hub/Harbor-v0": "hub: Harbor (Docker)",
    "hub/Verifiers-v0": "hub: verifiers (a hub venv, scripts/hub_venvs.sh)",
}
HUB_PACKAGES = ("reasoning_gym", "websockets", "verifiers", "openenv", "harbor", "docker")


def test_every_hub_id_has_its_metadata_and_is_registered_by_it():
    assert set(HUB_ENVS) == set(HUB_ENV_IDS) == set(SOURCES)
    for env_id, hub in HUB_ENVS.items():
        assert hub.env_id == env_id and HUB_ENV_IDS[env_id] == hub.entry_point
        assert gymnasium.spec(env_id).entry_point == hub.entry_point
        assert hub.source == SOURCES[env_id]
        assert (REPO / hub.doc).is_file() and all((REPO / x).is_file() for x in hub.examples)
        # exactly one way to tell whether the need is here
        assert sum([hub.extra_module is not None, hub.docker, hub.hub_venv is not None]) == 1, hub
        assert (hub.extra is None) == (hub.extra_module is None)


def test_the_extras_name_agentrls_extras():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for hub in HUB_ENVS.values():
        if hub.extra is not None:
            assert hub.extra in declared and f"extra {hub.extra}" == hub.needs


def test_an_extra_is_found_without_importing_it(monkeypatch):
    hub = HUB_ENVS["hub/ReasoningGym-v0"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "reasoning_gym" else None)
    assert hub_need_here(hub) == "installed"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert hub_need_here(hub) == "missing: pip install 'agentrl[reasoning-gym]'"
    assert hub_need_here(HUB_ENVS["hub/OpenEnv-v0"]) == "missing: pip install 'agentrl[openenv]'"


def test_docker_is_here_when_the_named_daemon_answers(monkeypatch):
    import sandboxes.docker.daemon as daemon

    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/agentrl-no-such-docker.sock")
    hub = HUB_ENVS["hub/Harbor-v0"]
    assert hub_need_here(hub, docker_timeout_s=0.2) == (
        "missing: no Docker daemon answers at unix:///tmp/agentrl-no-such-docker.sock (DOCKER_HOST)")
    monkeypatch.setattr(daemon, "docker_daemon_answers", lambda timeout_s, host=None: True)
    assert hub_need_here(hub) == "installed: a Docker daemon answers at unix:///tmp/agentrl-no-such-docker.sock"


def test_a_hub_venv_is_found_under_the_venv_root(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_HUB_VENVS", str(tmp_path))
    hub = HUB_ENVS["hub/Verifiers-v0"]
    assert hub_need_here(hub) == f"missing: no verifiers-* venv in {tmp_path} (bash scripts/hub_venvs.sh)"
    (tmp_path / "openenv-0.10.0" / "bin").mkdir(parents=True)
    (tmp_path / "openenv-0.10.0" / "bin" / "python").touch()  # another hub's venv does not count
    (tmp_path / "verifiers-0.4.0" / "bin").mkdir(parents=True)  # a venv without its python does not count
    assert hub_need_here(hub).startswith("missing:")
    for name in ("verifiers-0.4.0", "verifiers-0.3.1"):
        (tmp_path / name / "bin").mkdir(parents=True, exist_ok=True)
        (tmp_path / name / "bin" / "python").touch()
    assert hub_need_here(hub) == f"installed: verifiers-0.3.1, verifiers-0.4.0 in {tmp_path}"


def test_envs_list_says_where_each_hub_env_comes_from_and_whether_it_is_here(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "300")  # one line per row
    monkeypatch.setenv("AGENTRL_HUB_VENVS", str(tmp_path))  # no hub venv here
    res = CliRunner().invoke(app, ["envs", "list"])
    assert res.exit_code == 0, res.output
    rows = {cells[0]: cells[1:] for line in res.output.splitlines() if line.startswith("│")
            and len(cells := [c.strip() for c in line.strip()[1:-1].split("│")]) == 4}
    for env_id, source in SOURCES.items():
        hub = HUB_ENVS[env_id]
        assert rows[env_id][:2] == [hub.entry_point, source], rows[env_id]
        assert rows[env_id][2] == hub_need_here(hub), rows[env_id]
    assert rows["hub/Verifiers-v0"][2].startswith("missing: no verifiers-* venv")
    assert rows["agentrl/Sokoban-v0"][1:] == ["agentrl", ""]
    assert not any(v[1] == "yours" for k, v in rows.items() if k.startswith("hub/")), rows


def test_listing_imports_no_hub_package():
    code = ("import sys; import environments; from agentrl.hubs import HUB_ENVS; "
            "from agentrl.cli.maintenance import hub_need_here; [hub_need_here(h) for h in HUB_ENVS.values()]; "
            f"print(sorted(m for m in {HUB_PACKAGES!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _hub_examples() -> list[str]:
    return sorted(x for hub in HUB_ENVS.values() for x in hub.examples)


def test_every_hub_example_is_in_the_metadata():
    """An example config whose env is a hub env is one of that env's ``HubEnv.examples``."""
    found = sorted(f"examples/{p.name}" for p in (REPO / "examples").glob("*.yaml")
                   if str((yaml.safe_load(p.read_text()) or {}).get("env", {}).get("id", "")).startswith("hub/"))
    assert found == _hub_examples()


@pytest.mark.parametrize("example", _hub_examples())
def test_a_hub_example_config_loads(example):
    cfg = load_config(REPO / example)
    hub = next(h for h in HUB_ENVS.values() if example in h.examples)
    assert cfg.env.id == hub.env_id and cfg.env.kwargs


def test_the_reasoning_gym_example_passes_the_env_checker_with_its_kwargs():
    pytest.importorskip("reasoning_gym")
    from environments.checker import check_env, format_report

    cfg = load_config(REPO / "examples" / "reasoning_gym_mix.yaml")
    report = check_env(cfg.env.id, env_kwargs=dict(cfg.env.kwargs))
    assert report.ok, format_report(report)


def test_the_docs_index_names_every_hub_env_its_page_and_examples():
    index = (REPO / "docs" / "hubs" / "README.md").read_text()
    readme = (REPO / "README.md").read_text()
    assert "(docs/hubs/README.md)" in readme
    for hub in HUB_ENVS.values():
        assert f"`{hub.env_id}`" in index
        assert f"]({Path(hub.doc).name})" in index
        for example in hub.examples:
            assert f"(../../{example})" in index
