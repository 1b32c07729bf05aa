"""DockerSandbox specifics against a real dockerd: container settings, faults reported as
SandboxError, the reaper (C10), images built without a registry, and `auto`.

The contract, abuse and owner-lifetime suites (SIGKILL then ``agentrl sandbox gc``, SIGINT,
SIGTERM) run on Docker too (test_contract.py). Everything here is
marked ``docker``; scripts/test.sh starts the daemon and builds the base image.
"""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from tests.helpers.sandbox_checks import containers_with_label, procs_with_cmdline, require_docker, wait_until

from agentrl.errors import ConfigError, SandboxError
from sandboxes import SandboxSpec, make_sandbox, reap_orphans, resolve_backend
from sandboxes.bwrap import BwrapSandbox

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _docker():
    require_docker()


@pytest.fixture
def client():
    import docker

    c = docker.from_env(timeout=60)
    yield c
    c.close()


@pytest.fixture
def dsb(run_id):
    from sandboxes.docker import DockerSandbox

    sb = DockerSandbox(SandboxSpec(run_id=run_id, memory_mb=256, pids_limit=100, cpus=0.5))
    yield sb
    sb.close()
    assert containers_with_label(run_id) == []


def test_container_is_locked_down_and_labelled(dsb, client, run_id):
    info = client.api.inspect_container(dsb.container_id)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["Init"] is True
    assert host["ReadonlyRootfs"] is True
    assert host["Memory"] == 256 * 1024**2 and host["MemorySwap"] == 256 * 1024**2
    assert host["PidsLimit"] == 100
    assert host["NanoCpus"] == 500_000_000
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert set(host["Tmpfs"]) == {"/tmp", "/work"}
    assert info["Config"]["User"] == "1000:1000"
    labels = info["Config"]["Labels"]
    assert labels["agentrl.run_id"] == run_id
    assert labels["agentrl.sandbox_id"] == dsb.label.sandbox_id
    assert labels["agentrl.owner_pid"] == str(dsb.label.owner.pid)
    assert 0 < dsb.startup_s < 10  # capabilities and no_new_privs as seen inside: test_contract.py


def test_missing_image_raises_sandbox_error_naming_the_fix(run_id):
    from sandboxes.docker import DockerSandbox

    with pytest.raises(SandboxError, match="agentrl sandbox build-image"):
        DockerSandbox(SandboxSpec(run_id=run_id, image="agentrl-no-such-image:v0"))


def test_container_killed_mid_episode_raises_sandbox_error(dsb, client):
    assert dsb.exec("echo before").stdout == "before\n"
    client.api.kill(dsb.container_id)
    with pytest.raises(SandboxError, match="not running|is gone"):
        dsb.exec("echo after")
    assert not dsb.is_healthy()


def test_container_removed_mid_exec_raises_sandbox_error(dsb, client):
    import threading

    outcome: dict[str, object] = {}

    def run():
        try:
            outcome["result"] = dsb.exec("sleep 1013", timeout_s=60)  # a number no other test uses
        except SandboxError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert wait_until(lambda: procs_with_cmdline("sleep 1013") != [], timeout_s=10)
    client.api.remove_container(dsb.container_id, force=True)
    worker.join(timeout=20)
    assert not worker.is_alive()
    assert isinstance(outcome.get("error"), SandboxError), outcome


def test_auto_chooses_docker_when_the_daemon_answers_and_says_so(run_id, caplog, monkeypatch, tmp_path):
    import json

    from sandboxes.docker import DockerSandbox
    from sandboxes.docker.daemon import DOCKERD_STATE_VAR, daemon_pid

    # the daemon at the default socket as agentrl's scripts record the one they start (auto
    # takes no other unless it is named: test_daemon_choice.py)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    (tmp_path / "state.json").write_text(json.dumps({"pid": daemon_pid(), "host": "unix:///var/run/docker.sock"}))
    monkeypatch.setenv(DOCKERD_STATE_VAR, str(tmp_path / "state.json"))
    assert resolve_backend("auto") == "docker"
    with caplog.at_level(logging.INFO, logger="sandboxes"):
        sb = make_sandbox("auto", SandboxSpec(run_id=run_id))
    try:
        assert isinstance(sb, DockerSandbox)
        assert "sandboxes: docker at unix:///var/run/docker.sock (started by agentrl)" in caplog.text
        assert sb.exec("echo ok").stdout == "ok\n"
    finally:
        sb.close()
    with caplog.at_level(logging.INFO, logger="sandboxes"):
        sb = make_sandbox("auto", SandboxSpec(run_id=run_id, image="agentrl-no-such-image:v0"))
    try:
        assert isinstance(sb, BwrapSandbox)
        assert "lacks image 'agentrl-no-such-image:v0'" in caplog.text
    finally:
        sb.close()
    with pytest.raises(ConfigError, match="backend='podman' is unknown"):
        resolve_backend("podman")


# ---------------------------------------------------------------------------- reaper (C10)

def test_C10_reaper_spares_containers_of_live_owners(dsb, run_id):
    assert reap_orphans(run_id) == 0
    assert containers_with_label(run_id) == [dsb.container_id]
    assert dsb.exec("echo alive").stdout == "alive\n"
    assert reap_orphans(run_id, include_live_owners=True) == 1
    assert containers_with_label(run_id) == []
    with pytest.raises(SandboxError):
        dsb.exec("true")


# ---------------------------------------------------------------------------- daemon restart


def test_abuse_daemon_restarted_mid_episode_raises_sandbox_error(run_id):
    import dockerd_ctl

    from sandboxes.docker import DockerSandbox

    if not dockerd_ctl.owned():
        pytest.skip("the Docker daemon was not started by this test run (scripts/test.sh); not restarting it")
    sb = DockerSandbox(SandboxSpec(run_id=run_id))
    try:
        assert sb.exec("echo before").stdout == "before\n"
        dockerd_ctl.stop()
        with pytest.raises(SandboxError, match="daemon does not answer|is gone|not running"):
            sb.exec("echo while-down", timeout_s=5)
        assert dockerd_ctl.start()
        with pytest.raises(SandboxError, match="not running|is gone"):
            sb.exec("echo after", timeout_s=5)  # the daemon stopped the container
    finally:
        if not dockerd_ctl.owned():
            dockerd_ctl.start()
        sb.close()
    assert containers_with_label(run_id) == []


# ---------------------------------------------------------------------------- images


def test_an_exec_whose_wrapper_cannot_clean_up_is_ended_from_outside(dsb, client):
    """The command stops its wrapper (sh -> timeout -> wrapper: the parent of its parent),
    so nothing inside ends the exec: the stream stays open past the deadline, and the
    sandbox kills the exec's processes with a second exec. That exec runs as the sandbox's
    user: root without capabilities may not signal them, and then the container had to be
    killed (SandboxError) for a command that merely timed out."""
    r = dsb.exec("read -r _ _ _ pp _ < /proc/$PPID/stat; kill -STOP $pp; sleep 1014", timeout_s=1)
    assert (r.timed_out, r.exit_code) == (True, 137)
    assert r.duration_s < 8
    assert procs_with_cmdline("sleep 1014") == []
    assert client.api.inspect_container(dsb.container_id)["State"]["Running"]  # not killed
    assert dsb.exec("echo alive").stdout == "alive\n"


def test_execs_work_when_the_process_holds_more_than_1024_files(dsb):
    """A rollout process serving many agents through the gateway holds well over 1,024 open
    files; an exec's socket then gets a descriptor select.select() refuses (FD_SETSIZE). The
    exec reads it with a selector."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard} < 1300: cannot open the files this test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        r = dsb.exec("cat", stdin="x" * 50_000)  # stdin written and stdout read through the selector
        assert (r.exit_code, len(r.stdout)) == (0, 50_000)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_image_without_bash_still_kills_escapees(tmp_path, client, run_id):
    """The POSIX fallback of the clean-up scan (images without bash), in a real container."""
    from sandboxes.docker import DockerSandbox
    from sandboxes.docker.images import BASE_IMAGE, build_image

    name = f"agentrl-test-nobash-{uuid.uuid4().hex[:8]}:v1"
    df = tmp_path / "Dockerfile"
    df.write_text(f"FROM {BASE_IMAGE}\nUSER root\nRUN rm -f /usr/bin/bash /bin/bash\nUSER 1000:1000\n")
    built = build_image(name, dockerfile=df)
    try:
        with DockerSandbox(SandboxSpec(run_id=run_id, image=name)) as sb:
            assert sb.exec("[ -x /bin/bash ] && echo bash || echo none").stdout == "none\n"
            r = sb.exec("setsid sh -c 'sleep 987661' > /dev/null 2>&1 & nohup sleep 987662 > /dev/null 2>&1 & echo started")
            assert (r.exit_code, r.stdout, r.timed_out) == (0, "started\n", False)
            assert procs_with_cmdline("sleep 987661") == [] and procs_with_cmdline("sleep 987662") == []
            r = sb.exec("setsid sh -c 'sleep 987663' & sleep 1000", timeout_s=1)
            assert r.timed_out and r.duration_s < 5
            assert procs_with_cmdline("sleep 987663") == [] and procs_with_cmdline("sleep 1000") == []
    finally:
        for image in (name, built):
            try:
                client.images.remove(image, force=True)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass


def test_base_image_is_cached_by_recipe(caplog):
    from sandboxes.docker.images import BASE_IMAGE, RECIPE_LABEL, base_recipe, build_image

    lines: list[str] = []
    t0 = time.monotonic()
    image_id = build_image(progress=lines.append)
    assert time.monotonic() - t0 < 5  # nothing rebuilt
    assert lines == [f"{BASE_IMAGE} is up to date (recipe {base_recipe()[:12]})"]
    import docker

    labels = docker.from_env().images.get(BASE_IMAGE).labels
    assert labels[RECIPE_LABEL] == base_recipe() and image_id.startswith("sha256:")
    assert base_recipe(suite="trixie") != base_recipe()


def test_environment_image_from_a_dockerfile_is_rebuilt_only_when_its_recipe_changes(tmp_path, client, run_id):
    from sandboxes.docker import DockerSandbox
    from sandboxes.docker.images import BASE_IMAGE, build_image

    name = f"agentrl-test-env-{uuid.uuid4().hex[:8]}:v1"
    (tmp_path / "hello.txt").write_text("hello from the env image\n")
    df = tmp_path / "Dockerfile"
    df.write_text(f"FROM {BASE_IMAGE}\nCOPY hello.txt /opt/hello.txt\n")
    built: list[str] = []
    try:
        first = build_image(name, dockerfile=df)
        built.append(first)
        lines: list[str] = []
        assert build_image(name, dockerfile=df, progress=lines.append) == first
        assert lines and "is up to date" in lines[0]
        with DockerSandbox(SandboxSpec(run_id=run_id, image=name)) as sb:
            assert sb.exec("cat /opt/hello.txt").stdout == "hello from the env image\n"
        (tmp_path / "hello.txt").write_text("changed\n")  # a context file changes the recipe
        second = build_image(name, dockerfile=df)
        built.append(second)
        assert second != first
        assert first not in {img.id for img in client.images.list(all=True)}  # old build dropped
    finally:
        for image in [name, *built]:
            try:
                client.images.remove(image, force=True)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass


def test_build_image_errors_name_the_value(tmp_path):
    from sandboxes.docker.images import build_image

    with pytest.raises(ConfigError, match="name='Bad Name'"):
        build_image("Bad Name")
    with pytest.raises(ConfigError, match="does not exist"):
        build_image("agentrl-x:v1", dockerfile=tmp_path / "nope")
    df = tmp_path / "Dockerfile"
    df.write_text("FROM agentrl-no-such-base:v9\n")
    with pytest.raises(SandboxError, match="not a local image and cannot be pulled"):
        build_image("agentrl-x:v1", dockerfile=df)
    df.write_text("RUN true\n")
    with pytest.raises(ConfigError, match="no FROM line"):
        build_image("agentrl-x:v1", dockerfile=df)
