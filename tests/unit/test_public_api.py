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
    from agentrl import replay
    from agentrl.driver import controller
    from agentrl.config import Config, code_defaults, load_config, load_default_config

    assert agentrl.__version__ == metadata.version("agentrl")
    assert agentrl.load_config is load_config and agentrl.default_config is load_default_config
    assert agentrl.code_defaults is code_defaults
    assert agentrl.Config is Config and agentrl.train is controller.train
    assert agentrl.RunSummary is controller.RunSummary
    assert agentrl.register_estimator is critics.register_estimator
    assert agentrl.open_replay_store is replay.open_replay_store
    assert set(agentrl.__all__) <= set(dir(agentrl))
    assert {"RunSummary", "code_defaults", "open_replay_store", "train", "load_config", "default_config",
            "Config", "register_env", "register_estimator", "__version__"} <= set(agentrl.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        agentrl.nope  # noqa: B018


def test_type_checkers_see_every_forwarded_name():
    """The ``if TYPE_CHECKING:`` block of ``agentrl/__init__.py`` imports each lazily
    forwarded name from where it lives, so an editor or mypy sees its real signature
    (``agentrl.open_replay_store(...) -> ReplayStore``) instead of ``Any``."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(agentrl.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {(a.asname or a.name): (n.module, a.name) for n in block.body for a in n.names}
    assert seen == agentrl._LAZY


def test_open_replay_store_is_typed():
    import typing

    from agentrl.replay import ReplayStore

    hints = typing.get_type_hints(agentrl.open_replay_store)
    assert hints["return"] is ReplayStore
    assert typing.get_type_hints(agentrl.train)["return"] is agentrl.RunSummary


def test_load_config_without_a_file_is_the_code_defaults_not_the_embedded_default():
    code = agentrl.code_defaults(["run.iterations=2"])
    assert agentrl.load_config(None, ["run.iterations=2"]) == code
    assert code == agentrl.Config(run={"iterations": 2})  # the classes' own defaults
    embedded = agentrl.default_config(["run.iterations=2"])
    assert (code.env.id, embedded.env.id) == ("agentrl/HumanEval-v0", "agentrl/ShellLookup-v1")
    assert "code_defaults" in agentrl.load_config.__doc__ and "load_default_config" in agentrl.load_config.__doc__


def test_episode_reward_is_a_read_only_alias_of_total_reward():
    from agentrl.types import Episode, TerminationReason, Turn

    ep = Episode(group_id="g", env_id="e", task_id="t", seed=0, termination_reason=TerminationReason.ENV_TERMINATED)
    ep.turns += [Turn(prompt_ids=[1], completion_ids=[2], behavior_log_probs=[-0.1], reward=r) for r in (0.25, 0.5)]
    assert ep.reward == ep.total_reward == 0.75
    ep.turns[1].reward = 1.0  # computed from the turns, never stored twice
    assert ep.reward == 1.25
    with pytest.raises(AttributeError):
        ep.reward = 3.0  # type: ignore[misc]
    ep.termination_reason = TerminationReason.INFRA_ERROR
    assert ep.reward is None  # an errored episode has no reward (never 0)
    assert "reward" not in {f.name for f in __import__("dataclasses").fields(Episode)}


def _held_run(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "latest").mkdir(parents=True)  # what a run leaves: a checkpoint pointer
    return run_dir


def test_a_second_train_from_python_names_the_python_way_to_resume(tmp_path):
    run_dir = _held_run(tmp_path)
    cfg = agentrl.code_defaults([f"run.dir={run_dir}"])
    with pytest.raises(ConfigError) as info:
        agentrl.train(cfg)
    msg = str(info.value)
    assert f"run directory {run_dir} already holds a run" in msg
    assert "agentrl.train(cfg, resume=True)" in msg and "--resume" not in msg


def test_resume_without_a_checkpoint_names_no_command_line_flag(tmp_path):
    from agentrl.errors import CheckpointError

    cfg = agentrl.code_defaults([f"run.dir={tmp_path / 'empty'}"])
    with pytest.raises(CheckpointError, match=r"cannot resume: run directory .*empty has no checkpoint yet") as info:
        agentrl.train(cfg, resume=True)
    assert "--resume" not in str(info.value)


def test_a_second_agentrl_train_names_the_command_line_flag(tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli import app

    run_dir = _held_run(tmp_path)
    out = CliRunner().invoke(app, ["train", f"run.dir={run_dir}"])
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())  # however the terminal wraps it
    assert f"agentrl train --resume {run_dir}" in text and "resume=True" not in text


def test_default_config_is_what_agentrl_train_runs():
    cfg = agentrl.default_config(["run.iterations=2"])
    assert (cfg.env.id, cfg.run.iterations, cfg.rollout.max_new_tokens) == ("agentrl/ShellLookup-v1", 2, 128)
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
