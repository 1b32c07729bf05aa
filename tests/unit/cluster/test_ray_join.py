"""What a join to a cluster ships (``user_py_modules``), how ``auto`` finds a record under a
chosen ``--temp-dir``, and the one line of an actor whose constructor raised."""

from __future__ import annotations

import sys

import pytest

from agentrl.cluster.ray_join import recorded_cluster_addresses, user_py_modules
from agentrl.cluster.ray_setup import actor_failure_message, raised_error
from agentrl.errors import ConfigError


def test_only_modules_the_nodes_cannot_import_are_shipped(tmp_path, monkeypatch):
    (tmp_path / "calc_env.py").write_text("X = 1\n")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "envs.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("calc_env", "mypkg", "mypkg.envs"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    shipped = user_py_modules(["calc_env", "mypkg.envs", "mypkg", "environments.shell_lookup", "json", "gymnasium"])
    # a single-file module as its file, a dotted name as its top-level package, each once; the
    # project's packages, the standard library and site-packages stay (every node has them)
    assert shipped == [str(tmp_path / "calc_env.py"), str(tmp_path / "mypkg")]


def test_a_module_that_does_not_import_here_is_a_config_error():
    with pytest.raises(ConfigError, match=r"module 'no_such_env_module' could not be imported \(ModuleNotFoundError"):
        user_py_modules(["no_such_env_module"])


def test_auto_reads_the_default_record(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert recorded_cluster_addresses() == [] or all(f != str(tmp_path / "ray" / "ray_current_cluster")
                                                    for _, f in recorded_cluster_addresses())
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.9:6379\n")
    assert recorded_cluster_addresses()[0] == ("10.0.0.9:6379", str(tmp_path / "ray" / "ray_current_cluster"))


# What Ray's ActorDiedError says when a constructor raised (Ray 2.60; colour codes as Ray prints them).
CREATION = (
    "The actor died because of an error raised in its creation task, \x1b[36mray::TrainerActor.__init__()\x1b[39m "
    "(pid=30898, ip=192.0.2.2, actor_id=ab12, repr=<agentrl.cluster.actors.TrainerActor object at 0x7f>)\n"
    "  File \"/work/main/agentrl/cluster/actors.py\", line 489, in __init__\n"
    "    self.cfg = Config.model_validate(cfg_dict)\n"
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for Config\n"
    "  Value error, env.import_modules: module 'calc_env' could not be imported (ModuleNotFoundError: No module "
    "named 'calc_env'); it must be importable (on sys.path / PYTHONPATH) in every process of the run "
    "[type=value_error, input_value={'run': {'name': 'x'}}, input_type=dict]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"
)


def test_a_constructor_error_is_the_cause_on_the_line():
    from ray.exceptions import RayActorError

    exc = RayActorError("ab12", CREATION, actor_init_failed=True)
    assert actor_failure_message(exc) == (
        "actor TrainerActor (pid 30898) on node 192.0.2.2 could not start: ValidationError: env.import_modules: "
        "module 'calc_env' could not be imported (ModuleNotFoundError: No module named 'calc_env'); it must be "
        "importable (on sys.path / PYTHONPATH) in every process of the run")


def test_of_chained_errors_the_one_raised_last_is_named():
    text = ("ray::RolloutActor.__init__() (pid=1, ip=10.0.0.2)\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    import calc_env\n"
            "ModuleNotFoundError: No module named 'calc_env'\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "Traceback (most recent call last):\n  File \"y.py\", line 2, in g\n    raise ConfigError(...)\n"
            "agentrl.errors.ConfigError: environment module 'calc_env' could not be imported\n")
    assert raised_error(text) == "ConfigError: environment module 'calc_env' could not be imported"
    assert raised_error("nothing raised here\n  at all") is None
