"""Registration: built-ins, ``gymnasium.register`` in any namespace, and the
``agentrl.environments`` entry-point group of an installed distribution (a fixture
distribution under tests/fixtures/envpkg, put on sys.path / PYTHONPATH; no pip install)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest

import environments
from agentrl.errors import ConfigError, EnvError
from environments import registry

ENVPKG = Path(__file__).resolve().parents[2] / "fixtures" / "envpkg"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def envpkg_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVPKG))
    yield
    gymnasium.registry.pop("demo/Echo-v0", None)
    registry._loaded_entry_points.discard(("agentrl-demo-envs", "demo"))


def test_builtin_ids_are_registered():
    assert set(environments.registered_env_ids()) == {
        "agentrl/GuessNumber-v0", "agentrl/HumanEval-v0", "agentrl/MathAnswer-v0", "agentrl/ShellLookup-v1",
        "agentrl/ShellTasks-v0", "agentrl/Sokoban-v0", "agentrl/TextWorld-v0",
    }
    assert environments.register_envs() == []  # idempotent


def test_a_retired_id_names_its_successor_and_what_changed():
    # ShellLookup's tasks changed under the id v0; the current behaviour is v1
    for call in (environments.make_env, environments.env_class):
        with pytest.raises(ConfigError, match=r"'agentrl/ShellLookup-v0' is retired: use agentrl/ShellLookup-v1: "
                                              r"its tasks changed"):
            call("agentrl/ShellLookup-v0")
    # Gymnasium's own make says the same kind of thing (a later version is registered)
    with pytest.raises(gymnasium.error.DeprecatedEnv, match="ShellLookup-v1"):
        gymnasium.make("agentrl/ShellLookup-v0")
    assert environments.env_class("agentrl/ShellLookup-v1").__name__ == "ShellLookupEnv"


def test_entry_point_package_registers_its_env(envpkg_on_path):
    assert "demo/Echo-v0" not in gymnasium.registry
    added = environments.load_entry_points()
    assert added == ["demo/Echo-v0"]
    assert environments.load_entry_points() == []  # loaded once per process
    env = environments.make_env("demo/Echo-v0")
    obs, info = env.reset(seed=0, options={"task_id": "echo/river"})
    assert "river" in obs and info["anchor"] == ("echo/river", 0)
    assert env.step("river")[1:3] == (1.0, True)


def test_make_env_loads_entry_points_itself(envpkg_on_path):
    env = environments.make_env("demo/Echo-v0")
    assert type(env.unwrapped).__name__ == "EchoEnv"
    assert environments.env_class("demo/Echo-v0").task_ids("test") == ["echo/cloud"]


def test_make_env_injects_the_sandbox_and_passes_kwargs():
    class Box(gymnasium.Env):
        def __init__(self, sandbox=None, size=1):
            self.sandbox, self.size = sandbox, size

    gymnasium.register(id="usertest/Box-v0", entry_point=Box)
    try:
        sentinel = object()
        env = environments.make_env("usertest/Box-v0", sandbox=sentinel, size=3)
        assert env.unwrapped.sandbox is sentinel and env.unwrapped.size == 3
        with pytest.raises(ConfigError, match="nope"):
            environments.make_env("usertest/Box-v0", nope=1)
    finally:
        gymnasium.registry.pop("usertest/Box-v0")


def test_unknown_id_names_the_id():
    with pytest.raises(ConfigError, match=r"'nobody/Nothing-v0' is not registered"):
        environments.make_env("nobody/Nothing-v0")


def test_broken_entry_point_raises_env_error_naming_it(tmp_path, monkeypatch):
    pkg = tmp_path / "broken_eps"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def register():\n    raise RuntimeError('boom in register')\n")
    dist = tmp_path / "broken_eps-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-eps\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[agentrl.environments]\nbroken = broken_eps:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(EnvError, match=r"'broken'.*'broken-eps'.*boom in register"):
            environments.load_entry_points()
        assert environments.load_entry_points(strict=False) == []  # logged, not raised
        with pytest.raises(EnvError, match="boom in register"):  # retried, not forgotten
            environments.make_env("agentrl/Sokoban-v0")
    finally:
        registry._loaded_entry_points.discard(("broken-eps", "broken"))


def test_import_env_modules_from_names_and_env_var(tmp_path, monkeypatch):
    (tmp_path / "my_env_mod.py").write_text(
        "import gymnasium\n"
        "gymnasium.register(id='mine/Mod-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.ENV_MODULES_VAR, " my_env_mod , ")
    try:
        assert environments.import_env_modules() == ["mine/Mod-v0"]
    finally:
        gymnasium.registry.pop("mine/Mod-v0", None)
        sys.modules.pop("my_env_mod", None)
    with pytest.raises(ConfigError, match="'no_such_module_xyz'"):
        environments.import_env_modules(["no_such_module_xyz"])


def test_cli_envs_list_shows_an_installed_package_env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ENVPKG), str(REPO)]), COLUMNS="200")
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "envs", "list"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "demo/Echo-v0" in out.stdout
    assert "agentrl/HumanEval-v0" in out.stdout
