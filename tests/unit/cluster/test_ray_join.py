"""What a join to a cluster ships (``user_py_modules``: the env modules and the local modules
they import), how ``auto`` finds a record under a chosen ``--temp-dir``, and the one line of
an actor whose constructor raised (``raised_error`` on real traceback texts)."""

from __future__ import annotations

import sys
import traceback

import pytest

from agentrl.cluster.actors.error_text import raised_error
from agentrl.cluster.actors.ray_join import recorded_cluster_addresses, user_py_modules
from agentrl.cluster.actors.actor_errors import actor_failure_message
from agentrl.config import Config
from agentrl.errors import ConfigError


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory on ``sys.path`` for a user's modules; the modules imported from it are
    dropped from ``sys.modules`` afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


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


def _env_with_helpers(d, env: str) -> list[str]:
    """``env``.py importing a helper module beside it (two ways), a helper package, the
    standard library, site-packages and this project's packages; the paths that must ship."""
    (d / f"{env}.py").write_text(
        f"import json\nimport gymnasium\nimport environments\nimport {env}_helpers\n"
        f"from {env}_util import score\nfrom {env}_pkg.sub import VALUE\nX = {env}_helpers.X + VALUE\n")
    (d / f"{env}_helpers.py").write_text("X = 1\n")
    (d / f"{env}_util.py").write_text("def score():\n    return 1.0\n")
    (d / f"{env}_pkg").mkdir()
    (d / f"{env}_pkg" / "__init__.py").write_text("")
    (d / f"{env}_pkg" / "sub.py").write_text("VALUE = 2\n")
    return [str(d / f"{env}.py"), str(d / f"{env}_helpers.py"), str(d / f"{env}_util.py"), str(d / f"{env}_pkg")]


def test_the_local_modules_an_env_module_imports_are_shipped_with_it(user_dir):
    """Imported here first: what its import added to sys.modules."""
    expected = _env_with_helpers(user_dir, "calc_first")
    assert user_py_modules(["calc_first"]) == expected


def test_modules_imported_by_config_validation_ship_their_helpers(user_dir):
    """The run's path: ``Config`` validation imported the env module before the join."""
    expected = _env_with_helpers(user_dir, "calc_validated")
    Config.model_validate({"env": {"import_modules": ["calc_validated"]}})
    assert "calc_validated_helpers" in sys.modules
    assert user_py_modules(["calc_validated"]) == expected


def test_a_module_imported_earlier_by_the_user_ships_the_helpers_it_refers_to(user_dir):
    """Imported by the user's own code before any record (``import`` in a script): the
    modules its namespace refers to."""
    expected = _env_with_helpers(user_dir, "calc_early")
    __import__("calc_early")
    assert user_py_modules(["calc_early"]) == expected


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
    "(pid=30898, ip=192.0.2.2, actor_id=ab12, repr=<agentrl.cluster.actors.rollout_actor.TrainerActor object at 0x7f>)\n"
    "  File \"/work/main/agentrl/cluster/actors/rollout_actor.py\", line 489, in __init__\n"
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
    during = text.replace("The above exception was the direct cause of the following exception:",
                          "During handling of the above exception, another exception occurred:")
    assert raised_error(during) == "ConfigError: environment module 'calc_env' could not be imported"


def _traceback_of(fn) -> str:
    try:
        fn()
    except Exception:
        return traceback.format_exc()
    raise AssertionError("expected an exception")


def test_a_pydantic_error_names_each_field_with_its_message():
    """A real ``ValidationError`` traceback: the field's location is a line at column 0 of
    the message, not an exception."""
    one = _traceback_of(lambda: Config.model_validate({"run": {"iterations": -1}}))
    assert "\nrun.iterations\n" in one  # pydantic prints the location on its own line
    assert raised_error(one) == "ValidationError: run.iterations: Input should be greater than or equal to 1"
    two = _traceback_of(lambda: Config.model_validate({"run": {"iterations": -1}, "trainer": {"lr": "x"}}))
    assert raised_error(two) == (
        "ValidationError: run.iterations: Input should be greater than or equal to 1; trainer.lr: Input should be "
        "a valid number, unable to parse string as a number")
    # as Ray shows it: its header instead of "Traceback", then the frames
    ray_text = one.replace("Traceback (most recent call last):", "ray::TrainerActor.__init__() (pid=7, ip=10.0.0.2)")
    assert raised_error(ray_text) == raised_error(one)


def test_a_message_over_several_lines_is_one_error():
    def raise_two_lines():
        raise ConfigError("env.kwargs: 'size' must be positive\nNote: x")

    text = _traceback_of(raise_two_lines)
    assert raised_error(text) == "ConfigError: env.kwargs: 'size' must be positive Note: x"
