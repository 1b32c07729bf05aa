"""Run labels and on-disk layout shared by the bubblewrap backend and the reaper.

Every sandbox process tree carries a label in its environment (the outer ``bwrap`` process
and the sandbox's init, which is a fork of it):

* ``AGENTRL_RUN_ID``: the run (``SandboxSpec.run_id``);
* ``AGENTRL_OWNER_PID`` / ``AGENTRL_OWNER_START`` / ``AGENTRL_OWNER_PIDNS``: pid, start time
  (clock ticks since boot, field 22 of ``/proc/<pid>/stat``) and pid namespace (inode of
  ``/proc/<pid>/ns/pid``) of the process that created the sandbox (``Owner``); together they
  identify the owner even after its pid is reused;
* ``AGENTRL_SANDBOX_ID``: the sandbox.

Each sandbox also owns a host directory ``<root>/<run_id>/<pid>-<start>-<pidns>-<sandbox_id>/``
(its working directory and generated ``/etc`` files) and, when cgroups are used, cgroup
directories of the same name. A reaper that finds any of these whose owner is gone removes
them (docs/design.md, invariant 8; docs/cases.md, C10).

Pid namespaces: a pid means a process only in its own pid namespace. A process inside
``unshare --pid`` or a container that shares the cgroup file system, the sandbox root or the
Docker daemon with the host sees the host's sandboxes but not their owners (and the host sees
the processes of sandboxes made inside, labelled with pids of the inner namespace). So a
reaper judges only owners it can look up (``OwnerJudge``): those of its own pid namespace,
and, from the initial namespace as root, those of the namespaces below it (it sees all their
processes). The others' leftovers are removed only when their run is known to be over
(``include_live_owners``) or by a reaper that can judge them. Labels written before the
namespace was recorded (``<pid>-<start>-<id>``, no ``AGENTRL_OWNER_PIDNS``) have
``pid_ns=None`` and are judged as the reader's own, as they were then: they are leftovers of
earlier versions, whose owners are gone in practice, and nothing else would remove them.
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
OWNER_PIDNS_ENV = "AGENTRL_OWNER_PIDNS"
SANDBOX_ID_ENV = "AGENTRL_SANDBOX_ID"
ROOT_ENV = "AGENTRL_SANDBOX_ROOT"
"""Overrides the host directory that holds sandbox working directories."""

CGROUP_DIR_NAME = "agentrl"
"""Name of the directory under each cgroup controller's mount that holds our cgroups."""

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# <pid>-<start>-<pidns>-<sid>, or the older <pid>-<start>-<sid>: no field holds a '-', so the
# count of fields tells the two apart even when the hex sandbox id is all digits.
_DIR_RE = re.compile(r"(?P<pid>[0-9]{1,10})-(?P<start>[0-9]{1,20})-(?:(?P<ns>[0-9]{1,20})-)?(?P<sid>[0-9a-f]{6,64})")


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


def process_start_ticks(pid: int | str) -> int | None:
    """Start time of ``pid`` (or ``"self"``) in clock ticks since boot, as ``/proc`` shows it,
    or ``None`` if it does not exist (or is a zombie, which no longer runs)."""
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


def pid_namespace() -> int | None:
    """Inode of this process's pid namespace (``/proc/self/ns/pid``), in which its pids and
    ``/proc`` lookups mean something; ``None`` when it cannot be told, or when ``/proc`` is
    mounted for another pid namespace (``unshare --pid`` without ``--mount-proc``: then
    ``/proc/<pid>`` is not this namespace's process ``pid``)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


PROC_PID_INIT_INO = 0xEFFFFFFC
"""Inode of the initial pid namespace (the kernel's ``PROC_PID_INIT_INO``,
include/linux/proc_ns.h); every other pid namespace lies below it."""


def namespaced_pids() -> set[tuple[int | None, int]] | None:
    """``(pid namespace inode, pid in it)`` of every running process of a pid namespace below
    this one, inode ``None`` where it cannot be read (such a process may be any namespace's).

    ``None`` unless this process sees every process of the machine: root, in the initial pid
    namespace, with its ``/proc``. Reads ``NSpid`` of ``/proc/<pid>/status`` (Linux 4.1+)."""
    if os.geteuid() != 0 or pid_namespace() != PROC_PID_INIT_INO:
        return None
    out: set[tuple[int | None, int]] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                status = dict(line.partition(b":")[::2] for line in f.read().splitlines())
        except OSError:  # gone
            continue
        if b"NSpid" not in status:
            return None
        nspid = status[b"NSpid"].split()
        if len(nspid) < 2 or status.get(b"State", b"").split()[:1] == [b"Z"]:
            continue  # of this namespace, or a zombie (no longer runs)
        try:
            ns: int | None = os.stat(f"/proc/{entry}/ns/pid").st_ino
        except (FileNotFoundError, ProcessLookupError):  # gone meanwhile
            continue
        except OSError:  # e.g. a process that is not dumpable
            ns = None
        out.add((ns, int(nspid[-1])))
    return out


@dataclass(frozen=True)
class Owner:
    """The process that created a sandbox.

    Attributes:
        pid: its pid, in its own pid namespace.
        start_ticks: its start time, clock ticks since boot (``/proc/<pid>/stat`` field 22).
        pid_ns: inode of its pid namespace; ``None`` for a label written before that was
            recorded (judged as the reader's namespace's); 0 when its namespace could not be
            told (never judged).
    """

    pid: int
    start_ticks: int
    pid_ns: int | None = None

    @classmethod
    def current(cls) -> Owner:
        ns = pid_namespace()
        start = process_start_ticks("self")
        if start is None:  # /proc is always there on Linux; keep the label well-formed anyway
            start = 0
        return cls(os.getpid(), start, 0 if ns is None else ns)

    def is_local(self) -> bool:
        """True when the owner's pid can be looked up in this process's ``/proc``: this
        process's pid namespace can be told (``pid_namespace()``) and is the owner's, or the
        owner's was not recorded."""
        here = pid_namespace()
        return here is not None and self.pid_ns in (None, here)

    def is_alive(self) -> bool:
        """False only when the owner is known to be gone: it is of this pid namespace
        (``is_local()``) and no process with its pid and start time runs there. An owner of
        another pid namespace cannot be looked up here and counts as alive (``OwnerJudge``
        also tells the owners of lower namespaces from the initial one)."""
        return not self.is_local() or process_start_ticks(self.pid) == self.start_ticks

    def token(self) -> str:
        """``"<pid>-<start_ticks>-<pid_ns>"`` (``"<pid>-<start_ticks>"`` without ``pid_ns``);
        ``parse_token`` reads it back."""
        head = f"{self.pid}-{self.start_ticks}"
        return head if self.pid_ns is None else f"{head}-{self.pid_ns}"

    @classmethod
    def parse_token(cls, value: str) -> Owner | None:
        """The owner in a ``token()``, the older ``"<pid>-<start_ticks>"`` included;
        ``None`` if ``value`` is not one."""
        parts = value.split("-")
        if len(parts) not in (2, 3) or not all(p.isascii() and p.isdigit() for p in parts):
            return None
        return cls(int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) == 3 else None)


class OwnerJudge:
    """Tells, for one reap, which owners are gone.

    * An owner of this pid namespace (or of an older label without one): gone when no
      process with its pid and start time runs (``Owner.is_alive``).
    * An owner of a pid namespace below this one, judged from the initial namespace as root
      (``namespaced_pids``): gone when no process of its namespace has its pid there (its
      namespace gone, or that pid unused in it), in a scan made after its label was read (an
      owner exists before its label; a scan from before could miss an owner started since).
      The start time is not compared: a time namespace shifts it.
    * Any other (a sibling container's, a lower namespace judged from a non-initial one, an
      unknown namespace): cannot be told, so never judged gone.
    """

    def __init__(self) -> None:
        self._lower: set[tuple[int | None, int]] | None = None
        self._gone: set[tuple[int, int, int]] = set()

    def is_gone(self, owner: Owner) -> bool | None:
        """True: gone; False: runs; None: cannot be told from this process."""
        if owner.is_local():
            return not owner.is_alive()
        if not owner.pid_ns:
            return None
        key = (owner.pid_ns, owner.pid, owner.start_ticks)
        if key in self._gone:  # that process was gone in an earlier scan; it does not come back
            return True
        if self._lower is None or not self._runs(owner):
            self._lower = namespaced_pids()  # a scan after the label was read
        if self._lower is None:
            return None
        if self._runs(owner):
            return False
        self._gone.add(key)
        return True

    def _runs(self, owner: Owner) -> bool:
        lower = self._lower or set()
        return (owner.pid_ns, owner.pid) in lower or (None, owner.pid) in lower


@dataclass(frozen=True)
class SandboxLabel:
    """The label one sandbox's processes and directories carry."""

    run_id: str
    owner: Owner
    sandbox_id: str

    @property
    def dir_name(self) -> str:
        """Name of the sandbox's host and cgroup directories (under ``<run_id>/``):
        ``<pid>-<start>-<pid_ns>-<sandbox_id>``."""
        return f"{self.owner.token()}-{self.sandbox_id}"

    def environ(self) -> dict[str, str]:
        env = {
            RUN_ID_ENV: self.run_id,
            OWNER_PID_ENV: str(self.owner.pid),
            OWNER_START_ENV: str(self.owner.start_ticks),
            SANDBOX_ID_ENV: self.sandbox_id,
        }
        if self.owner.pid_ns is not None:
            env[OWNER_PIDNS_ENV] = str(self.owner.pid_ns)
        return env

    @classmethod
    def from_environ(cls, env: dict[str, str]) -> SandboxLabel | None:
        """The label in a process environment, or ``None`` if it carries none. Without
        ``AGENTRL_OWNER_PIDNS`` (an older label) the owner's ``pid_ns`` is ``None``. A label
        with a malformed owner gets owner pid 0 (never alive, when judged)."""
        run_id = env.get(RUN_ID_ENV)
        if run_id is None or OWNER_PID_ENV not in env:
            return None
        try:
            ns = env.get(OWNER_PIDNS_ENV)
            owner = Owner(int(env[OWNER_PID_ENV]), int(env.get(OWNER_START_ENV, "-1")),
                          None if ns is None else int(ns))
        except ValueError:
            owner = Owner(0, -1)
        return cls(run_id, owner, env.get(SANDBOX_ID_ENV, ""))

    @classmethod
    def from_dir(cls, run_id: str, name: str) -> SandboxLabel | None:
        """Parse a directory name made by ``dir_name``, or the older ``<pid>-<start>-<id>``
        (owner ``pid_ns=None``); ``None`` if it is neither."""
        m = _DIR_RE.fullmatch(name)
        if m is None:
            return None
        ns = m["ns"]
        return cls(run_id, Owner(int(m["pid"]), int(m["start"]), None if ns is None else int(ns)), m["sid"])


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
