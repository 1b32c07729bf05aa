"""The Docker side of ``hub/Harbor-v0``: a task's image, its container, copying a task's
``tests/`` or ``solution/`` into it, and the verifier.

Image
    ``environment/Dockerfile`` is built with agentrl's Docker sandbox backend
    (``sandboxes.docker.images.build_image``: no pull, build network ``none``, cached by the
    recipe of the Dockerfile, its folder and its ``FROM`` image), at the first ``reset`` of the
    task in a process (once per process: ``ImageCache``), waited on for the task's
    ``build_timeout_sec``. Its ``FROM`` image must already be on the daemon (there is no
    registry: build ``agentrl-base:latest`` with ``agentrl sandbox build-image`` and start from
    it, or ``docker load`` your own). ``[environment] docker_image`` names an image to run as
    it is; it must be on the daemon too.

Container
    One ``DockerSandbox`` per episode (``task_spec``): the image, its own ``WORKDIR`` as the
    working directory with its files (``SandboxSpec.writable_root``), tmpfs ``/logs``,
    ``/tests`` and ``/solution``, the network of the task's policy
    (``harbor_task.container_network``), its cpus and memory. Commands run as the sandbox user
    (uid 1000, no capabilities): the image must give that user what the task needs (own its
    working directory). ``bash`` and ``tar`` must be in the image.

Verifier
    ``tests/`` is copied into an emptied ``/tests`` after the agent is done (so nothing the
    agent did can change it), ``/logs/verifier`` is emptied, and ``bash /tests/test.sh`` runs
    in the working directory with ``[verifier] env`` for at most the verifier timeout. Its
    reward is ``reward.txt``, else ``reward.json`` (``harbor_task.parse_reward``). A run past
    the timeout, a missing or malformed reward, or a container that fails raises
    ``HarborError`` / ``SandboxError`` (infrastructure errors, never a score).
"""

from __future__ import annotations

import hashlib
import io
import logging
import posixpath
import re
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from agentrl.hubs.harbor_task import HarborError, HarborTask, parse_reward
from agentrl.types import ExecResult
from sandboxes.base import SandboxSpec
from sandboxes.docker.daemon import daemon_address, docker_client
from sandboxes.docker.images import build_image, image_exists, image_workdir
from sandboxes.docker.sandbox import DockerSandbox

__all__ = ["ImageCache", "IMAGES", "TASK_DIRS", "Verdict", "image_name", "stage_dir", "run_script", "task_spec",
           "verify"]

log = logging.getLogger(__name__)

TASK_DIRS = ("/logs", "/tests", "/solution")
"""The tmpfs directories of a task's container (Harbor's layout)."""
VERIFIER_DIR = "/logs/verifier"
AGENT_LOG_DIR = "/logs/agent"
STAGE_TIMEOUT_S = 120.0
READ_TIMEOUT_S = 30.0
_OUTPUT_TAIL_CHARS = 2000


def image_name(task: HarborTask) -> str:
    """The image name a task's Dockerfile is built as: ``agentrl-harbor/<folder>:<12 hex of
    its absolute path>`` (the folder name lowercased to what Docker allows), so two task sets
    with a task of the same name do not share an image."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", task.task_id.lower()).strip("-._")[:80] or "task"
    digest = hashlib.sha256(str(task.path).encode()).hexdigest()[:12]
    return f"agentrl-harbor/{slug}:{digest}"


class ImageCache:
    """The task images this process has made ready, by daemon and name: each is built (or
    found) once per process, one build at a time per image."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[tuple[str, str], str] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}

    def ensure(self, task: HarborTask, client: Any, docker_host: str | None, timeout_multiplier: float = 1.0) -> str:
        """The image to run ``task`` from (its ``docker_image``, or its Dockerfile built) on
        the daemon ``docker_host`` names (``client``: a client of it, for the look-up).

        Raises:
            HarborError: the image is missing, the build failed (its log in the message) or
                ran past ``build_timeout_sec * timeout_multiplier``.
        """
        name = task.config.docker_image or image_name(task)
        key = (daemon_address(docker_host), name)
        with self._lock:
            if key in self._ready:
                return self._ready[key]
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._ready:
                    return self._ready[key]
            timeout_s = task.config.build_timeout_s * timeout_multiplier
            if task.config.docker_image is not None:
                _check_image(task, name, client)
            else:
                _build(task, name, docker_host, timeout_s)
            with self._lock:
                self._ready[key] = name
            return name

    def clear(self) -> None:
        """Forget every image made ready (after they were removed from the daemon)."""
        with self._lock:
            self._ready.clear()


IMAGES = ImageCache()
"""The process's image cache."""


def _check_image(task: HarborTask, name: str, client: Any) -> None:
    if not image_exists(name, client):
        raise HarborError(f"task {task.task_id!r}: [environment] docker_image={name!r} is not on the Docker "
                          "daemon, and nothing is pulled; docker load it first", task_id=task.task_id)


def _build(task: HarborTask, name: str, docker_host: str | None, timeout_s: float) -> None:
    outcome: dict[str, BaseException | None] = {}

    def build() -> None:
        try:
            client = docker_client(timeout_s=max(timeout_s, 60.0), host=docker_host)
            try:
                build_image(name, dockerfile=task.environment_dir / "Dockerfile", context=task.environment_dir,
                            client=client)
            finally:
                client.close()
            outcome["error"] = None
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = exc

    log.info("building the image %s of Harbor task %r", name, task.task_id)
    worker = threading.Thread(target=build, name=f"harbor-build-{task.task_id}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if "error" not in outcome:
        raise HarborError(f"task {task.task_id!r}: building {name} ran past build_timeout_sec ({timeout_s:g} s)",
                          task_id=task.task_id)
    error = outcome["error"]
    if error is not None:
        raise HarborError(f"task {task.task_id!r}: building {name} from {task.environment_dir}/Dockerfile failed: "
                          f"{error}", task_id=task.task_id) from error


def task_spec(task: HarborTask, image: str, client: Any, *, network: str, run_id: str, cpus: float, memory_mb: int,
              pids_limit: int, template: SandboxSpec | None = None) -> SandboxSpec:
    """The ``SandboxSpec`` of ``task``'s container (module docstring); ``client`` reads the
    image's ``WORKDIR``. ``cpus`` and ``memory_mb`` apply where the task sets none;
    ``template`` (the spec of a sandbox the run made) gives the run id, read-only mounts,
    variables and output limit.

    Raises:
        HarborError: the image declares no usable ``WORKDIR``.
        SandboxError: the daemon does not answer.
    """
    workdir = image_workdir(image, client)
    if not workdir or workdir == "/" or not workdir.startswith("/"):
        raise HarborError(f"task {task.task_id!r}: image {image} declares WORKDIR {workdir!r}; the task's files "
                          "need a working directory of their own (add e.g. WORKDIR /app to environment/Dockerfile)",
                          task_id=task.task_id)
    fields: dict[str, Any] = {"run_id": run_id}
    if template is not None:
        fields = {"run_id": template.run_id, "ro_mounts": template.ro_mounts, "env": dict(template.env),
                  "output_limit_bytes": template.output_limit_bytes}
    return SandboxSpec(image=image, network=network, workdir=posixpath.normpath(workdir),
                       cpus=task.config.cpus or cpus, memory_mb=task.config.memory_mb or memory_mb,
                       pids_limit=pids_limit, writable_root=True, tmpfs_dirs=TASK_DIRS, **fields)


def _tar_of(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return buf.getvalue()


def stage_dir(sandbox: Any, folder: Path, target: str, task_id: str) -> None:
    """Empty ``target`` in the sandbox and copy the local ``folder`` into it (one exec, a tar
    archive on stdin; nothing is left of what was there).

    Raises:
        HarborError: the copy failed or timed out. SandboxError: the sandbox failed.
    """
    script = 'find "$1" -mindepth 1 -delete && tar -xf - -C "$1"'
    try:
        data = _tar_of(folder)
    except OSError as exc:
        raise HarborError(f"task {task_id!r}: reading {folder}: {exc}", task_id=task_id) from None
    r = sandbox.exec(["sh", "-c", script, "sh", target], stdin=data, timeout_s=STAGE_TIMEOUT_S)
    if r.exit_code != 0 or r.timed_out:
        raise HarborError(f"task {task_id!r}: copying {folder} to {target} failed (exit {r.exit_code}, "
                          f"timed out {r.timed_out}): {r.stderr[-500:]}", task_id=task_id)


def prepare(sandbox: Any, task_id: str) -> None:
    """Make ``/logs/agent`` and ``/logs/verifier`` in a fresh container.

    Raises:
        HarborError: the exec failed. SandboxError: the sandbox failed.
    """
    r = sandbox.exec(["mkdir", "-p", AGENT_LOG_DIR, VERIFIER_DIR], timeout_s=READ_TIMEOUT_S)
    if r.exit_code != 0:
        raise HarborError(f"task {task_id!r}: mkdir {AGENT_LOG_DIR} {VERIFIER_DIR} failed: {r.stderr[-500:]}",
                          task_id=task_id)


def run_script(sandbox: Any, path: str, timeout_s: float, env: Mapping[str, str]) -> ExecResult:
    """``bash <path>`` in the working directory with ``env``, for at most ``timeout_s``
    seconds; the result as it came (the caller judges it). Raises SandboxError."""
    return sandbox.exec(["bash", path], timeout_s=timeout_s, env=dict(env))


def read_optional(sandbox: Any, path: str, task_id: str) -> str | None:
    """The text of the file ``path`` in the sandbox, None when there is none.

    Raises:
        HarborError: it exists but could not be read. SandboxError: the sandbox failed.
    """
    r = sandbox.exec(["sh", "-c", '[ -f "$1" ] || exit 3; cat -- "$1"', "sh", path], timeout_s=READ_TIMEOUT_S)
    if r.exit_code == 3:
        return None
    if r.exit_code != 0 or r.timed_out:
        raise HarborError(f"task {task_id!r}: reading {path} failed (exit {r.exit_code}): {r.stderr[-300:]}",
                          task_id=task_id)
    return r.stdout


@dataclass(frozen=True)
class Verdict:
    """What the verifier found.

    Attributes:
        reward: the episode's reward.
        rewards: every named value the verifier wrote (``{"reward": r}`` for ``reward.txt``).
        exit_code: ``test.sh``'s exit code (Harbor reads the reward file, not this).
        output: the tail of its stdout and stderr.
    """

    reward: float
    rewards: Mapping[str, float]
    exit_code: int | None
    output: str


def verify(sandbox: Any, task: HarborTask, timeout_s: float) -> Verdict:
    """Run the task's verifier in ``sandbox`` (module docstring).

    Raises:
        HarborError: ``test.sh`` ran past ``timeout_s`` seconds, or its reward is missing or
            malformed (its output tail in the message). SandboxError: the sandbox failed.
    """
    stage_dir(sandbox, task.tests_dir, "/tests", task.task_id)
    r = sandbox.exec(["sh", "-c", 'mkdir -p "$1" && find "$1" -mindepth 1 -delete', "sh", VERIFIER_DIR],
                     timeout_s=READ_TIMEOUT_S)
    if r.exit_code != 0:
        raise HarborError(f"task {task.task_id!r}: emptying {VERIFIER_DIR} failed: {r.stderr[-300:]}",
                          task_id=task.task_id)
    result = run_script(sandbox, "/tests/test.sh", timeout_s, task.config.verifier_env)
    output = (result.stdout + result.stderr)[-_OUTPUT_TAIL_CHARS:]
    if result.timed_out:
        raise HarborError(f"task {task.task_id!r}: tests/test.sh ran past the verifier timeout ({timeout_s:g} s); "
                          f"its output: {output[-500:]!r}", task_id=task.task_id)
    txt = read_optional(sandbox, f"{VERIFIER_DIR}/reward.txt", task.task_id)
    js = read_optional(sandbox, f"{VERIFIER_DIR}/reward.json", task.task_id) if txt is None else None
    try:
        reward, rewards = parse_reward(txt, js, task.task_id)
    except HarborError as exc:
        raise HarborError(f"{exc} (test.sh exit code {result.exit_code}; its output: {output[-500:]!r})",
                          task_id=task.task_id) from None
    return Verdict(reward, rewards, result.exit_code, output)


def start_sandbox(spec: SandboxSpec, client: Any) -> Any:
    """A ``DockerSandbox`` of ``spec`` made with ``client`` (its owner closes the client).

    Raises:
        SandboxError: the container did not start (a ``bridge`` network the daemon lacks
            included).
    """
    return DockerSandbox(spec, client=client)


def open_client(docker_host: str | None) -> Any:
    """A Docker client of the daemon ``docker_host`` names (``sandboxes.docker.daemon``);
    the caller closes it. Raises SandboxError when the daemon does not answer."""
    return docker_client(host=docker_host)
