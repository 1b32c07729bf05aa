"""``ray_session``: one local Ray instance (4 logical CPUs) for the cluster tests that use it.

It is started by the first test that asks for it and kept while the tests that follow ask
for it too, also across modules (consecutive modules that each started and stopped their own
instance paid Ray's start-up and shutdown each time, several seconds on 2 busy cores). It is
shut down after the last test of a module when the next test does not ask for it (it may
start a Ray instance or a multi-node ``Cluster`` of its own, or run ``agentrl train``, which
must start its own), and at the end of the session. The folder's tests that use it (or the
``trained_run`` that trains on it) run first, the others after them
(``pytest_collection_modifyitems``), so it starts once per session, not once per stretch.

A module that leaves actors behind does not hand them to the next one: before the instance
is handed over, every CPU must be free again (``ray.kill`` is asynchronous: waited for up to
``_FREE_WAIT_S``), else it is replaced by a fresh one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

_FREE_WAIT_S = 10.0
_NUM_CPUS = 4
_state = {"ours": False}  # whether the Ray instance of this process is the one ray_session started


def _start():
    import ray

    from agentrl.cluster.actors.ray_connect import LOCAL_SYSTEM_CONFIG

    ray.init(address="local", num_cpus=_NUM_CPUS, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}},
             _system_config=LOCAL_SYSTEM_CONFIG)  # as agentrl's own local start: no idle prestarted workers
    _state["ours"] = True


def _stop():
    import ray

    if _state["ours"] and ray.is_initialized():
        ray.shutdown()
    _state["ours"] = False


def _all_free(ray) -> bool:
    deadline = time.monotonic() + _FREE_WAIT_S
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0.0) >= _NUM_CPUS - 1e-6:
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def ray_session():
    import ray

    if _state["ours"] and ray.is_initialized():
        if not _all_free(ray):  # the previous module left actors holding CPUs: start clean
            _stop()
            _start()
    else:
        _start()
    yield ray


_RAY_FIXTURES = ("ray_session", "trained_run")  # trained_run trains on the ray_session instance


def _uses_ray_session(item) -> bool:
    names = getattr(item, "fixturenames", ()) if item is not None else ()
    return any(name in names for name in _RAY_FIXTURES)


def pytest_collection_modifyitems(session, config, items):
    """The tests of this folder that use the shared instance first (each keeping its place
    among them), then the others: in file order they alternated with tests that need Ray
    down (a multi-node ``Cluster``, ``agentrl train`` subprocesses, a train() that starts
    its own instance), so the shared instance was stopped and started again 6 times (a
    local Ray start is 4-8 s on 2 cores). Only the order of this folder's tests changes;
    they stay where the folder's tests were in the session."""
    here = Path(__file__).resolve().parent
    places = [i for i, item in enumerate(items) if here in Path(str(item.path)).resolve().parents]
    mine = [items[i] for i in places]
    ordered = [it for it in mine if _uses_ray_session(it)] + [it for it in mine if not _uses_ray_session(it)]
    for i, item in zip(places, ordered):
        items[i] = item


@pytest.hookimpl(trylast=True)  # after the module's own fixtures were torn down (their actors killed)
def pytest_runtest_teardown(item, nextitem):
    if not _state["ours"]:
        return
    if nextitem is not None and nextitem.module is item.module:
        return  # a module-scoped ray_session stays as long as its module runs
    if not _uses_ray_session(nextitem):
        _stop()


def pytest_sessionfinish(session, exitstatus):
    _stop()


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, tiny_model_path):
    """One real training run that several modules only read (``(run_dir, summary)``): the
    end-to-end and warm-pool checks of test_train_loop.py and the rerun of
    test_rerun_trained.py. Each paid a run of its own (about 35 s of start-up apiece on 2
    cores). Two iterations of HumanEval (2 tasks x 2 rollouts) in bubblewrap sandboxes from a
    warm pool of 4, the default GRPO path, the tiny model. The random model earns 0, so every
    advantage is 0 and the trainer takes no optimizer step: the weights stay the starting
    ones (test_export.py trains a run of its own whose weights move).
    Runs on the Ray instance ``ray_session`` manages (started here when none is up)."""
    import ray

    from agentrl.driver.controller import train
    from test_train_loop import make_cfg

    if not ray.is_initialized():
        _start()
    base = tmp_path_factory.mktemp("trained-run")
    cfg = make_cfg(base, tiny_model_path, "run", "run.iterations=2", "sandbox.pool_size=4", "sandbox.max_sandboxes=4",
                   "trainer.lr=1e-3")
    summary = train(cfg)
    return base / "run", summary
