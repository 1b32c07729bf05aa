"""A user's env module reaches the actors of a cluster started with ``ray start``, and an
actor that cannot import it fails with that cause on the one line.

The cluster is real and multi-process: a head and a worker node, each its own ``ray start
--block`` process (own temp dir, its process group SIGKILLed at the end; never ``ray stop``,
which would end every Ray instance of the machine), started with no ``PYTHONPATH``. The user's
module lives only in a temp dir on the driver's ``PYTHONPATH``, as a user's does, and imports
a helper module beside it (which travels with it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.errors import ClusterError

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).with_name("ray"))

CALC_ENV = '''
import gymnasium
import calc_helpers
gymnasium.register("calcuser/Calc-v0", entry_point="environments.shell_lookup:ShellLookupEnv")
MARK = "calc_env from the driver's temp dir with " + calc_helpers.MARK
'''
CALC_HELPERS = 'MARK = "its helper"\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _node_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    env.update(RAY_AUTH_MODE="token", OMP_NUM_THREADS="1")  # a worker joining a token cluster needs it too
    return env


@pytest.fixture(scope="module")
def ray_start_cluster():
    """``(gcs address, user module dir)``: ``ray start --head`` and one ``ray start --address``
    worker with the custom resource ``far``."""
    assert not ray.is_initialized()
    tmp = tempfile.mkdtemp(prefix="agentrl-rs-", dir="/tmp")  # short: Ray's socket paths live under it
    user_dir = Path(tempfile.mkdtemp(prefix="agentrl-user-"))
    (user_dir / "calc_env.py").write_text(CALC_ENV)
    (user_dir / "calc_helpers.py").write_text(CALC_HELPERS)
    port = _free_port()
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [RAY, "start", "--head", "--block", f"--port={port}", f"--temp-dir={tmp}/h", "--num-cpus=2",
             "--include-dashboard=false", "--disable-usage-stats", "--resources", '{"head": 1}'],
            env=_node_env(), cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        ip = ray.util.get_node_ip_address()
        address = f"{ip}:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection((ip, port), timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    pytest.fail("ray start --head did not come up")
                time.sleep(0.5)
        procs.append(subprocess.Popen(
            [RAY, "start", "--block", f"--address={address}", "--num-cpus=2", "--disable-usage-stats",
             "--resources", '{"far": 1}'],
            env=_node_env(), cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RAY_AUTH_MODE", "token")
            mp.delenv("RAY_ADDRESS", raising=False)
            mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(user_dir), os.environ.get("PYTHONPATH")])))
            mp.syspath_prepend(str(user_dir))
            try:
                from ray._raylet import Config

                Config.initialize("")  # read RAY_AUTH_MODE in this process too
            except ImportError:
                pass
            ray.init(address=address, logging_level="WARNING")  # wait until the worker node is there
            try:
                deadline = time.monotonic() + 120
                while ray.cluster_resources().get("far", 0) < 1:
                    if time.monotonic() > deadline:
                        pytest.fail("the worker node did not join")
                    time.sleep(0.5)
            finally:
                ray.shutdown()
            yield address, user_dir
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the agents ignore SIGTERM; the whole group goes
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(user_dir, ignore_errors=True)


def _cfg(address: str, tiny_model_path: str, tmp_path: Path):
    return load_config(None, [f"cluster.address={address}", "env.import_modules=[calc_env]", "env.id=calcuser/Calc-v0",
                              f"model.path={tiny_model_path}", f"run.dir={tmp_path / 'run'}",
                              "cluster.rendezvous_timeout_s=60"])


@ray.remote(num_cpus=0.1)
def _validate(cfg_dict: dict) -> str:
    """What every actor does first: validate the run config, which imports env.import_modules."""
    from agentrl.config import Config

    Config.model_validate(cfg_dict)
    import calc_env

    return f"{calc_env.MARK} on {ray.get_runtime_context().get_node_id()}"


def test_the_users_module_reaches_every_node(ray_start_cluster, tiny_model_path, tmp_path):
    from agentrl.cluster.actors.ray_connect import connect

    address, _ = ray_start_cluster
    cfg = _cfg(address, tiny_model_path, tmp_path)
    assert connect(cfg)
    try:
        cfg_dict = cfg.model_dump(mode="json")
        on_head = ray.get(_validate.options(resources={"head": 0.01}).remote(cfg_dict), timeout=180)
        on_worker = ray.get(_validate.options(resources={"far": 0.01}).remote(cfg_dict), timeout=180)
        assert "calc_env from the driver's temp dir with its helper" in on_head
        assert "calc_env from the driver's temp dir with its helper" in on_worker
        assert on_head.split(" on ")[1] != on_worker.split(" on ")[1]  # two nodes, two processes that import it
    finally:
        ray.shutdown()


def test_an_actor_that_cannot_import_it_says_so_on_the_one_line(ray_start_cluster, tiny_model_path, tmp_path,
                                                               monkeypatch):
    """Without the modules shipped (as before), the trainer rank's constructor fails on the
    node; the error's one line carries that cause, not Ray's creation-task header."""
    from agentrl.cluster.actors import ray_connect, ray_join
    from agentrl.cluster.actors.trainer_group import TrainerGroup

    address, _ = ray_start_cluster
    cfg = _cfg(address, tiny_model_path, tmp_path)
    monkeypatch.setattr(ray_join, "ship_user_modules", lambda cfg, runtime_env: None)
    assert ray_connect.connect(cfg)
    try:
        opts = {"num_cpus": 0.5, "resources": {"far": 0.5}}
        with pytest.raises(ClusterError) as err:
            TrainerGroup(cfg, cfg.model_dump(mode="json"), tiny_model_path, opts)
    finally:
        ray.shutdown()
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("trainer rank 0 did not start: actor TrainerActor (pid ")
    assert ("could not start: ValidationError: env.import_modules: module 'calc_env' could not be imported "
            "(ModuleNotFoundError: No module named 'calc_env')") in line, line


def test_auto_finds_a_cluster_started_with_its_own_temp_dir(ray_start_cluster, tiny_model_path, tmp_path,
                                                            monkeypatch):
    """``ray start --temp-dir DIR`` records the cluster in ``DIR/ray_current_cluster`` only;
    ``auto`` (no ``RAY_ADDRESS``) finds it through the head running here."""
    from agentrl.cluster.actors.ray_connect import connect

    address, _ = ray_start_cluster
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no record under the default temp dir
    cfg = _cfg("auto", tiny_model_path, tmp_path)
    assert connect(cfg)
    try:
        assert ray.get_runtime_context().gcs_address == address
    finally:
        ray.shutdown()
