"""``import agentrl``: a small public API (load a config, train, register an environment or
an estimator, open the replay store) and ``__version__``, imported lazily so the import
itself stays cheap."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

import agentrl
from agentrl.errors import ConfigError


def test_import_agentrl_loads_nothing_heavy():
    code = ("import sys, agentrl\n"
            "print(sorted(m for m in ('torch', 'ray', 'vllm', 'gymnasium', 'pydantic', 'yaml', 'numpy', "
            "'environments', 'critics', 'agentrl.config') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_public_names_are_the_functions_they_forward_to():
    import critics
    from agentrl.cluster import controller
    from agentrl.config import Config, load_config, load_default_config

    assert agentrl.__version__ == metadata.version("agentrl")
    assert agentrl.load_config is load_config and agentrl.default_config is load_default_config
    assert agentrl.Config is Config and agentrl.train is controller.train
    assert agentrl.register_estimator is critics.register_estimator
    assert set(agentrl.__all__) <= set(dir(agentrl))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        agentrl.nope  # noqa: B018


def test_default_config_is_what_agentrl_train_runs():
    cfg = agentrl.default_config(["run.iterations=2"])
    assert (cfg.env.id, cfg.run.iterations, cfg.rollout.max_new_tokens) == ("agentrl/ShellLookup-v0", 2, 128)
    assert cfg.eval.before_training and cfg.eval.after_training  # the summary ends with held-out eval before / after


def test_register_env_registers_once_and_refuses_a_different_entry_point():
    import gymnasium

    env_id = "apitest/Echo-v0"
    try:
        agentrl.register_env(env_id, "some_module:Echo")
        agentrl.register_env(env_id, "some_module:Echo")  # the same again: a no-op
        assert gymnasium.registry[env_id].entry_point == "some_module:Echo"
        with pytest.raises(ConfigError, match="already registered with entry point 'some_module:Echo'"):
            agentrl.register_env(env_id, "other:Echo")
    finally:
        gymnasium.registry.pop(env_id, None)


def test_open_replay_store_takes_a_run_directory_or_a_url(tmp_path):
    from agentrl.replay import ReplayStore

    with pytest.raises(ConfigError, match="not a run directory with a replay.db"):
        agentrl.open_replay_store(tmp_path)
    ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}").start_run("run-1", {"a": 1})
    by_dir = agentrl.open_replay_store(tmp_path)
    by_url = agentrl.open_replay_store(f"sqlite:///{tmp_path / 'replay.db'}")
    assert [r.run_id for r in by_dir.runs()] == [r.run_id for r in by_url.runs()] == ["run-1"]
