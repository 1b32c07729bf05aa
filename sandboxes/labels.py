"""Run labels and on-disk layout shared by the bubblewrap backend and the reaper.

Every sandbox process tree carries a label in its environment (the outer ``bwrap`` process
and the sandbox's init, which is a fork of it):

* ``AGENTRL_RUN_ID``: the run (``SandboxSpec.run_id``);
* ``AGENTRL_OWNER_PID`` / ``AGENTRL_OWNER_START``: pid and start time (clock ticks since
  boot, field 22 of ``/proc/<pid>/stat``) of the process that created the sandbox; the pair
  identifies the owner even after its pid is reused;
* ``AGENTRL_SANDBOX_ID``: the sandbox.

Each sandbox also owns a host directory ``<root>/<run_id>/<pid>-<start>-<sandbox_id>/`` (its
working directory and generated ``/etc`` files) and, when cgroups are used, cgroup
directories of the same name. A reaper that finds any of these whose owner is gone removes
them (design.md, invariant 8; case C10).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError

RUN_ID_ENV = "AGENTRL_RUN_ID"
OWNER_PID_ENV = "AGENTRL_OWNER_PID"
OWNER_START_ENV = "AGENTRL_OWNER_START"
SANDBOX_ID_ENV = "AGENTRL_SANDBOX_ID"
ROOT_ENV = "AGENTRL_SANDBOX_ROOT"
"""Overrides the host directory that holds sandbox working directories."""

CGROUP_DIR_NAME = "agentrl"
"""Name of the directory under each cgroup controller's mount that holds our cgroups."""

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_DIR_RE = re.compile(r"^(?P<pid>[0-9]+)-(?P<start>[0-9]+)-(?P<sid>[0-9a-f]{6,64})$")


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is safe as a directory name and an environment value.

    Raises:
        ConfigError: not 1-128 characters of ``[A-Za-z0-9_.-]`` starting alphanumeric.
    """
    if not isinstance(run_id, str) or not _RUN_ID_RE.match(run_id):
        raise ConfigError(
            f"run_id={run_id!r} is invalid; expected 1-128 characters of [A-Za-z0-9_.-] "
            "starting with a letter or digit"
        )
    return run_id


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or ``None`` if it does not exist
    (or is a zombie, which no longer runs)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Owner:
    """The process that created a sandbox."""

    pid: int
    start_ticks: int

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        start = process_start_ticks(pid)
        if start is None:  # /proc is always there on Linux; keep the label well-formed anyway
            start = 0
        return cls(pid, start)

    def is_alive(self) -> bool:
        """True while the same process (pid and start time) still runs."""
        return process_start_ticks(self.pid) == self.start_ticks


@dataclass(frozen=True)
class SandboxLabel:
    """The label one sandbox's processes and directories carry."""

    run_id: str
    owner: Owner
    sandbox_id: str

    @property
    def dir_name(self) -> str:
        """Name of the sandbox's host and cgroup directories (under ``<run_id>/``)."""
        return f"{self.owner.pid}-{self.owner.start_ticks}-{self.sandbox_id}"

    def environ(self) -> dict[str, str]:
        return {
            RUN_ID_ENV: self.run_id,
            OWNER_PID_ENV: str(self.owner.pid),
            OWNER_START_ENV: str(self.owner.start_ticks),
            SANDBOX_ID_ENV: self.sandbox_id,
        }

    @classmethod
    def from_environ(cls, env: dict[str, str]) -> SandboxLabel | None:
        """The label in a process environment, or ``None`` if it carries none. A label
        with a malformed owner gets owner pid 0 (never alive)."""
        run_id = env.get(RUN_ID_ENV)
        if run_id is None or OWNER_PID_ENV not in env:
            return None
        try:
            owner = Owner(int(env[OWNER_PID_ENV]), int(env.get(OWNER_START_ENV, "-1")))
        except ValueError:
            owner = Owner(0, -1)
        return cls(run_id, owner, env.get(SANDBOX_ID_ENV, ""))

    @classmethod
    def from_dir(cls, run_id: str, name: str) -> SandboxLabel | None:
        """Parse a directory name made by ``dir_name``; ``None`` if it is not one."""
        m = _DIR_RE.match(name)
        if m is None:
            return None
        return cls(run_id, Owner(int(m["pid"]), int(m["start"])), m["sid"])


def sandbox_root() -> Path:
    """Host directory holding ``<run_id>/<sandbox>/`` directories.

    ``$AGENTRL_SANDBOX_ROOT`` if set, else ``/tmp/agentrl-sandboxes`` for root and
    ``/tmp/agentrl-sandboxes-<uid>`` for other users (a fixed path, so that a reaper started
    later, with another ``$TMPDIR``, finds what a crashed run left).
    """
    override = os.environ.get(ROOT_ENV)
    if override:
        return Path(override)
    uid = os.getuid()
    return Path("/tmp/agentrl-sandboxes" if uid == 0 else f"/tmp/agentrl-sandboxes-{uid}")


def read_environ(pid: int) -> dict[str, str] | None:
    """Environment of a process from ``/proc/<pid>/environ``; ``None`` when unreadable
    (gone, another user's, kernel thread)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env
