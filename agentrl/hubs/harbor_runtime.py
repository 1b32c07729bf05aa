"""The Docker side of ``hub/Harbor-v0``: a task's image, its container, copying a task's
``tests/`` or ``solution/`` into it, and the verifier.

Image
    ``environment/Dockerfile`` is built with agentrl's Docker sandbox backend
    (``sandboxes.docker.images.build_image``: no pull, build network ``none``, cached by the
    recipe of the Dockerfile, its folder and its ``FROM`` image), at the first ``reset`` of the
    task in a process (once per process: ``ImageCache``), waited on for the task's
    ``build_timeout_sec``; a build past it goes on, and the image's next ``reset`` waits for
    it rather than starting another (one build per image at a time). Its ``FROM`` image must
    already be on the daemon (there is no registry: build ``agentrl-base:latest`` with
    ``agentrl sandbox build-image`` and start from it, or ``docker load`` your own).
    ``[environment] docker_image`` names an image to run as it is; it must be on the daemon too.

Container
    One ``DockerSandbox`` per episode (``task_spec``): the image, its own ``WORKDIR`` as the
    working directory with its files (``SandboxSpec.writable_root``), tmpfs ``/logs``,
    ``/tests`` and ``/solution``, the network of the task's policy
    (``harbor_task.container_network``), its cpus and memory. Commands run as the sandbox user
    (uid 1000, no capabilities): the image must give that user what the task needs (own its
    working directory). ``bash`` and ``tar`` must be in the image.

Verifier
    When the agent is done, every process it left in the container is killed (``stop_agent``:
    the agent and the verifier share the sandbox user, so a process left running could write
    the reward; a task whose tests need a server the agent or ``solve.sh`` left running
    cannot be scored here), ``/logs/verifier`` is removed whatever the agent made of it and
    made again as an empty directory, ``tests/`` is copied into an emptied ``/tests`` (so
    nothing the agent did can change it), and ``bash /tests/test.sh`` runs in the working
    directory with ``PATH`` = ``VERIFIER_PATH`` and ``[verifier] env`` for at most the
    verifier timeout. Its reward is ``reward.txt``, else ``reward.json``
    (``harbor_task.parse_reward``). What ``test.sh`` itself runs from the agent's files (the
    working directory, ``HOME``, which is the working directory, and what Python or a test
    runner loads from them) is the agent's, as in Harbor, where agent and verifier share one
    container: docs/hubs/harbor.md. A process that outlives its kill, a run past the
    timeout, a missing or malformed reward, or a container that fails raises ``HarborError``
    / ``SandboxError`` (infrastructure errors, never a score).
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
from typing import Any, Callable, Mapping

from agentrl.hubs.harbor_task import HarborError, HarborTask, parse_reward
from agentrl.types import ExecResult
from sandboxes.base import SandboxSpec
from sandboxes.docker.daemon import daemon_address, docker_client
from sandboxes.docker.images import build_image, image_exists, image_workdir
from sandboxes.docker.sandbox import DockerSandbox

__all__ = ["ImageCache", "IMAGES", "STOP_AGENT_SCRIPT", "TASK_DIRS", "VERIFIER_PATH", "Verdict", "image_name",
           "reset_verifier_dir", "run_script", "stage_dir", "stop_agent", "task_spec", "verify"]

log = logging.getLogger(__name__)

TASK_DIRS = ("/logs", "/tests", "/solution")
"""The tmpfs directories of a task's container (Harbor's layout)."""
VERIFIER_DIR = "/logs/verifier"
AGENT_LOG_DIR = "/logs/agent"
STAGE_TIMEOUT_S = 120.0
READ_TIMEOUT_S = 30.0
_OUTPUT_TAIL_CHARS = 2000
VERIFIER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` of ``test.sh`` (a task's ``[verifier] env`` may set another): no directory the
sandbox user can write to, unless the image made one so."""

# Run by bash as the sandbox user (uid 1000, the agent's) before the verifier; builtins only
# but `sleep`. It keeps pid 1 (the container's init), the container's main process (the
# child of pid 1 that started first: the agent's processes all started later), itself and
# its ancestors (this exec's wrapper and `timeout`). kill(-1) signals every other process of
# the uid in the container's pid namespace in one kernel pass, so SIGSTOP freezes them all at
# once (a fork in progress is restarted, and a stopped process cannot fork): then each is
# SIGKILLed, passes repeat until one finds none but zombies (at most ~10 s), and what this
# stopped of its own (the main process, the ancestors) is continued on the way out. Exit 3
# and the survivors on stdout when some remain.
STOP_AGENT_SCRIPT = r"""exec 2>/dev/null
keep=" 1 $$ "; p=$$
while read -r st < "/proc/$p/stat"; do
  set -- ${st##*") "}; p=$2
  [ "$p" -gt 1 ] || break
  keep="$keep$p "
done
main=; t0=
for d in /proc/[0-9]*; do
  read -r st < "$d/stat" || continue
  set -- ${st##*") "}
  [ "$2" = 1 ] || continue
  if [ -z "$t0" ] || [ "${20}" -lt "$t0" ]; then t0=${20}; main=${d#/proc/}; fi
done
keep="$keep$main "
cont() { for k in $keep; do [ "$k" = 1 ] || [ "$k" = "$$" ] || kill -s CONT "$k"; done; }
trap cont EXIT
kill -s STOP -- -1
end=$((SECONDS + 10))
while :; do
  left=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case $keep in *" $p "*) continue;; esac
    read -r st < "$d/stat" || continue
    case ${st##*") "} in Z*|X*) continue;; esac
    kill -s KILL "$p"
    c=${st#*"("}; left="$left $p (${c%")"*})"
  done
  [ -z "$left" ] && exit 0
  [ "$SECONDS" -lt "$end" ] || break
  sleep 0.05
done
echo "still running after SIGKILL:$left"
exit 3
"""


def image_name(task: HarborTask) -> str:
    """The image name a task's Dockerfile is built as: ``agentrl-harbor/<folder>:<12 hex of
    its absolute path>`` (the folder name lowercased to what Docker allows), so two task sets
    with a task of the same name do not share an image."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", task.task_id.lower()).strip("-._")[:80] or "task"
    digest = hashlib.sha256(str(task.path).encode()).hexdigest()[:12]
    return f"agentrl-harbor/{slug}:{digest}"


class ImageCache:
    """The task images this process has made ready, by daemon and name: each is built (or
    found) once per process, and one build of an image runs at a time: a build past its
    timeout keeps running in its thread (Docker cannot cancel it) and holds the image's lock
    until it ends, so a later ``ensure`` of that image waits for it (at most its own build
    timeout, then ``HarborError``) and never starts a second build beside it; a build that
    ends well after its timeout still marks the image ready."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[tuple[str, str], str] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}

    def ensure(self, task: HarborTask, client: Any, docker_host: str | None, timeout_multiplier: float = 1.0) -> str:
        """The image to run ``task`` from (its ``docker_image``, or its Dockerfile built) on
        the daemon ``docker_host`` names (``client``: a client of it, for the look-up).

        Raises:
            HarborError: the image is missing, the build failed (its log in the message) or
                ran past ``build_timeout_sec * timeout_multiplier``, or an earlier build of
                the image still runs after that long.
        """
        name = task.config.docker_image or image_name(task)
        key = (daemon_address(docker_host), name)
        timeout_s = task.config.build_timeout_s * timeout_multiplier
        with self._lock:
            if key in self._ready:
                return self._ready[key]
            lock = self._locks.setdefault(key, threading.Lock())
        if not lock.acquire(timeout=min(timeout_s, threading.TIMEOUT_MAX)):
            raise HarborError(f"task {task.task_id!r}: an earlier build of {name} (one build per image at a time) "
                              f"still runs after {timeout_s:g} s more; try again when it ends", task_id=task.task_id)
        handed_over = False  # a started build's thread releases the lock when the build ends
        try:
            with self._lock:
                if key in self._ready:
                    return self._ready[key]
            if task.config.docker_image is not None:
                _check_image(task, name, client)
            else:
                handed_over = True
                _build(task, name, docker_host, timeout_s, lambda ok: self._build_ended(key, name, lock, ok))
            with self._lock:
                self._ready[key] = name
            return name
        finally:
            if not handed_over:
                lock.release()

    def _build_ended(self, key: tuple[str, str], name: str, lock: threading.Lock, ok: bool) -> None:
        if ok:
            with self._lock:
                self._ready[key] = name
        lock.release()

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


def _build(task: HarborTask, name: str, docker_host: str | None, timeout_s: float,
           ended: Callable[[bool], None]) -> None:
    """Build ``name`` in a thread and wait for it at most ``timeout_s``; the thread calls
    ``ended(ok)`` once when the build ends, however long it takes (also when it could not
    start)."""
    outcome: dict[str, BaseException | None] = {}

    def build() -> None:
        ok = False
        try:
            client = docker_client(timeout_s=max(timeout_s, 60.0), host=docker_host)
            try:
                build_image(name, dockerfile=task.environment_dir / "Dockerfile", context=task.environment_dir,
                            client=client)
            finally:
                client.close()
            outcome["error"], ok = None, True
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = exc
        finally:
            ended(ok)

    log.info("building the image %s of Harbor task %r", name, task.task_id)
    worker = threading.Thread(target=build, name=f"harbor-build-{task.task_id}", daemon=True)
    try:
        worker.start()
    except BaseException:
        ended(False)
        raise
    worker.join(timeout_s)
    if "error" not in outcome:
        raise HarborError(f"task {task.task_id!r}: building {name} ran past build_timeout_sec ({timeout_s:g} s); "
                          "the build goes on, and the image's next reset waits for it", task_id=task.task_id)
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
    """Empty ``target`` in the sandbox (a directory of the sandbox user: its mode and its
    tree's modes are made the owner's again first, so nothing the agent left there blocks
    the emptying) and copy the local ``folder`` into it (one exec, a tar archive on stdin;
    nothing is left of what was there).

    Raises:
        HarborError: the copy failed or timed out. SandboxError: the sandbox failed.
    """
    script = ('[ -d "$1" ] && [ ! -L "$1" ] || { echo "$1 is not a directory" >&2; exit 1; }; '
              'chmod -R u+rwX -- "$1" 2>/dev/null; chmod 755 -- "$1" && find "$1" -mindepth 1 -delete && '
              'tar -xf - -C "$1"')
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


def stop_agent(sandbox: Any, task_id: str) -> None:
    """End every process the agent left in the container (``STOP_AGENT_SCRIPT``): all of
    the sandbox user's processes but the container's init and main process, and this exec's
    own, are frozen at once (``kill -STOP -1``: nothing forks past it) and killed; then none
    may remain.

    Raises:
        HarborError: a process still runs after being killed for ``READ_TIMEOUT_S`` seconds
            (its pid and name in the message). SandboxError: the sandbox failed.
    """
    r = sandbox.exec(["bash", "-c", STOP_AGENT_SCRIPT, "stop-agent"], timeout_s=READ_TIMEOUT_S)
    if r.exit_code != 0 or r.timed_out:
        raise HarborError(f"task {task_id!r}: ending the agent's processes before the verifier failed (exit "
                          f"{r.exit_code}, timed out {r.timed_out}): {(r.stdout + r.stderr)[-500:]}", task_id=task_id)


def reset_verifier_dir(sandbox: Any, task_id: str) -> None:
    """Remove ``/logs/verifier`` whatever it is (a directory, a symlink, a file) and make it
    again: an empty real directory of the sandbox user, mode 755.

    Raises:
        HarborError: it could not be remade. SandboxError: the sandbox failed.
    """
    script = ('d=$1; chmod u+rwx -- "${d%/*}"; [ -L "$d" ] || chmod -R u+rwX -- "$d" 2>/dev/null; '
              'rm -rf -- "$d" && mkdir -m 755 -- "$d" && [ -d "$d" ] && [ ! -L "$d" ]')
    r = sandbox.exec(["sh", "-c", script, "sh", VERIFIER_DIR], timeout_s=READ_TIMEOUT_S)
    if r.exit_code != 0 or r.timed_out:
        raise HarborError(f"task {task_id!r}: remaking {VERIFIER_DIR} failed (exit {r.exit_code}): "
                          f"{r.stderr[-300:]}", task_id=task_id)


def verify(sandbox: Any, task: HarborTask, timeout_s: float) -> Verdict:
    """Run the task's verifier in ``sandbox`` (module docstring): end the agent's processes,
    remake ``/logs/verifier``, copy ``tests/`` into ``/tests``, run ``bash /tests/test.sh``
    with ``PATH`` = ``VERIFIER_PATH`` and ``[verifier] env``, read the reward.

    Raises:
        HarborError: a process of the agent outlived its kill, ``test.sh`` ran past
            ``timeout_s`` seconds, or its reward is missing or malformed (its output tail in
            the message). SandboxError: the sandbox failed.
    """
    stop_agent(sandbox, task.task_id)
    reset_verifier_dir(sandbox, task.task_id)
    stage_dir(sandbox, task.tests_dir, "/tests", task.task_id)
    result = run_script(sandbox, "/tests/test.sh", timeout_s, {"PATH": VERIFIER_PATH, **task.config.verifier_env})
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
