"""Resource limits for bubblewrap sandboxes: cgroup v1 when writable, else rlimits.

Two mechanisms, chosen once per sandbox at construction (``BwrapSandbox.limits``):

``cgroup-v1`` (preferred; needs write access to the v1 ``memory`` and ``pids`` hierarchies
under ``/sys/fs/cgroup``, i.e. root outside a locked-down container)
    One cgroup per sandbox in each of the ``memory``, ``pids`` and (when mounted) ``cpu``
    hierarchies, at ``<mount>/agentrl/<run_id>/<pid>-<start>-<pidns>-<sandbox_id>`` (the
    owner's identity, ``sandboxes.labels``; a reaper judges only owners of its own pid
    namespace). Limits hold for everything running in the sandbox together, concurrent
    execs included: ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``, so swap
    does not extend it; the kernel's OOM killer kills inside the sandbox only), ``pids.max``, and
    ``cpu.cfs_quota_us`` for ``cpus``. Each exec enters the cgroups through a ``/bin/sh``
    launcher that writes its own pid to ``cgroup.procs`` and then ``exec``\\ s bwrap, so no
    process of the sandbox ever runs outside them. The launcher already runs as the
    sandbox's uid, so ``cgroup.procs`` (only that file) is given to that uid; the limit
    files stay root's, and the sandbox cannot see ``/sys`` anyway.

``rlimit`` (fallback; e.g. cgroup v2-only hosts, unprivileged users)
    ``prlimit --as=<memory_mb MiB> --nproc=<pids_limit>`` around bwrap. Caveats: RLIMIT_AS is
    per process (a sandbox may run several processes each up to the limit) and counts
    virtual, not resident, memory. RLIMIT_NPROC counts all processes of the sandbox's host
    *uid*: when the caller is root every sandbox has a uid of its own (see
    ``sandboxes.bwrap``), so it is a per-sandbox limit; for an unprivileged caller the
    sandboxes run as the caller and the caller's other processes count too. ``cpus`` is not
    enforced. The sandbox's tmpfs mounts are sized to ``memory_mb`` in both modes.

cgroup v2 is not used yet: on a v2-only host the fallback applies (and is logged).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agentrl.errors import ConfigError, SandboxError
from sandboxes.labels import CGROUP_DIR_NAME, SandboxLabel

logger = logging.getLogger(__name__)

LimitsMode = Literal["auto", "cgroup", "rlimit"]
MIB = 1024 * 1024

# Runs as: sh -c SCRIPT agentrl-sandbox N procs_1 .. procs_N argv...
# Moves itself into N cgroups, then becomes argv (bwrap). Exit 125 if a cgroup is gone.
_ENTER_CGROUPS_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo "$$" > "$1" || exit 125; shift; '
    'n=$((n - 1)); done; exec "$@"'
)
_V1_CONTROLLERS = ("memory", "pids", "cpu")
_V1_REQUIRED = ("memory", "pids")


@dataclass
class LimitGroup:
    """The limits of one sandbox.

    Attributes:
        kind: ``"cgroup-v1"``, ``"rlimit"`` or ``"none"``.
        launcher: argv prefix that runs the argv after it inside the limits.
        cgroup_dirs: controller name -> cgroup directory (cgroup mode only).
    """

    kind: str
    launcher: tuple[str, ...]
    cgroup_dirs: dict[str, Path] = field(default_factory=dict)

    def pids(self) -> set[int]:
        """Processes in the sandbox's cgroups (empty outside cgroup mode)."""
        out: set[int] = set()
        for d in self.cgroup_dirs.values():
            try:
                text = (d / "cgroup.procs").read_text()
            except OSError:
                continue
            out.update(int(x) for x in text.split())
        return out

    def kill_all(self, wait_s: float = 5.0) -> set[int]:
        """SIGKILL every process in the cgroups until they are empty (or ``wait_s``
        passes). Returns the pids signalled."""
        killed: set[int] = set()
        deadline = time.monotonic() + wait_s
        while True:
            pids = self.pids()
            if not pids or time.monotonic() > deadline:
                return killed
            for pid in pids - killed:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def remove(self, wait_s: float = 5.0) -> bool:
        """Kill what is left and delete the cgroup directories. Returns True when all of
        them are gone; logs and returns False otherwise (a reaper retries later)."""
        if not self.cgroup_dirs:
            return True
        self.kill_all(wait_s)
        ok = True
        for d in self.cgroup_dirs.values():
            ok &= _rmdir_cgroup(d, wait_s)
            try:
                d.parent.rmdir()  # the run's directory, once its last sandbox is gone
            except OSError:
                pass
        return ok

    def counters(self) -> dict[str, int]:
        """Kernel counters of the sandbox's cgroups (cgroup mode only):
        ``memory_max_usage_bytes``, ``memory_failcnt``, ``pids_current``,
        ``pids_limit_hits`` (forks refused by ``pids.max``)."""
        out: dict[str, int] = {}
        mem = self.cgroup_dirs.get("memory")
        if mem is not None:
            out["memory_max_usage_bytes"] = _read_int(mem / "memory.max_usage_in_bytes")
            out["memory_failcnt"] = _read_int(mem / "memory.failcnt")
        pids = self.cgroup_dirs.get("pids")
        if pids is not None:
            out["pids_current"] = _read_int(pids / "pids.current")
            try:
                events = (pids / "pids.events").read_text().split()
                out["pids_limit_hits"] = int(events[events.index("max") + 1])
            except (OSError, ValueError, IndexError):
                out["pids_limit_hits"] = -1
        return out


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1


def _rmdir_cgroup(d: Path, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                logger.warning("could not remove cgroup %s: %s", d, exc)
                return False
            time.sleep(0.02)


def _v1_mounts() -> dict[str, Path]:
    """Controller name -> mount point of each cgroup v1 hierarchy (from mountinfo)."""
    out: dict[str, Path] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return out
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fstype, _source, options = (right.split() + ["", "", ""])[:3]
        if fstype != "cgroup":
            continue
        mount_point = Path(left.split()[4].replace("\\040", " "))
        for opt in options.split(","):
            if opt in _V1_CONTROLLERS and opt not in out:
                out[opt] = mount_point
    return out


@functools.lru_cache(maxsize=1)
def cgroup_v1_bases() -> dict[str, Path] | None:
    """``<mount>/agentrl`` for each usable v1 controller, or ``None`` when the required
    ``memory`` and ``pids`` hierarchies are missing or not writable. Cached per process."""
    mounts = _v1_mounts()
    bases: dict[str, Path] = {}
    for ctrl in _V1_CONTROLLERS:
        if ctrl not in mounts:
            continue
        base = mounts[ctrl] / CGROUP_DIR_NAME
        try:
            base.mkdir(exist_ok=True)
        except OSError:
            continue
        if os.access(base, os.W_OK):
            bases[ctrl] = base
    if not all(c in bases for c in _V1_REQUIRED):
        return None
    return bases


def iter_cgroup_v1_sandboxes() -> Iterator[tuple[SandboxLabel, LimitGroup]]:
    """Every sandbox cgroup present (for the reaper), grouped across controllers."""
    bases = cgroup_v1_bases() or {}
    found: dict[tuple[str, str], dict[str, Path]] = {}
    for ctrl, base in bases.items():
        try:
            runs = list(base.iterdir())
        except OSError:
            continue
        for run_dir in runs:
            try:
                sandboxes = [d for d in run_dir.iterdir() if d.is_dir()]
            except OSError:  # a file such as cgroup.procs, or removed meanwhile
                continue
            for d in sandboxes:
                found.setdefault((run_dir.name, d.name), {})[ctrl] = d
    for (run_id, name), dirs in found.items():
        label = SandboxLabel.from_dir(run_id, name)
        if label is not None:
            yield label, LimitGroup("cgroup-v1", (), dirs)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _create_cgroup_v1(
    bases: dict[str, Path],
    label: SandboxLabel,
    memory_mb: int,
    pids_limit: int,
    cpus: float,
    uid: int,
    gid: int,
) -> LimitGroup:
    dirs: dict[str, Path] = {}
    group = LimitGroup("cgroup-v1", (), dirs)
    try:
        for ctrl, base in bases.items():
            d = base / label.run_id / label.dir_name
            d.mkdir(parents=True)
            dirs[ctrl] = d
        mem = dirs["memory"]
        limit = str(memory_mb * MIB)
        _write(mem / "memory.limit_in_bytes", limit)
        if (mem / "memory.memsw.limit_in_bytes").exists():
            _write(mem / "memory.memsw.limit_in_bytes", limit)
        _write(dirs["pids"] / "pids.max", str(pids_limit))
        if "cpu" in dirs:
            period = 100_000
            _write(dirs["cpu"] / "cpu.cfs_period_us", str(period))
            _write(dirs["cpu"] / "cpu.cfs_quota_us", str(max(1000, int(cpus * period))))
        if uid != os.getuid():
            # The launcher runs as the sandbox's uid and moves itself in; the limit files
            # stay root's.
            for d in dirs.values():
                os.chown(d / "cgroup.procs", uid, gid)
    except OSError as exc:
        group.remove(wait_s=1.0)
        raise SandboxError(f"could not create the sandbox's cgroups ({exc})") from exc
    procs = [str(d / "cgroup.procs") for d in dirs.values()]
    group.launcher = ("/bin/sh", "-c", _ENTER_CGROUPS_SCRIPT, "agentrl-sandbox", str(len(procs)), *procs)
    return group


def create_limits(
    mode: LimitsMode,
    label: SandboxLabel,
    *,
    memory_mb: int,
    pids_limit: int,
    cpus: float,
    uid: int,
    gid: int,
) -> LimitGroup:
    """Set up the limits of one sandbox.

    Args:
        mode: ``"auto"`` (cgroup v1 when writable, else rlimit), ``"cgroup"`` (required) or
            ``"rlimit"``.
        label: the sandbox's label (names the cgroup directories).
        memory_mb: memory limit (MiB). pids_limit: processes/threads. cpus: cores.
        uid, gid: host identity the sandbox's processes run as.

    Raises:
        ConfigError: unknown ``mode``.
        SandboxError: ``mode="cgroup"`` but cgroup v1 is not writable, or creating the
            cgroups failed.
    """
    if mode not in ("auto", "cgroup", "rlimit"):
        raise ConfigError(f"limits={mode!r}; expected 'auto', 'cgroup' or 'rlimit'")
    if mode in ("auto", "cgroup"):
        bases = cgroup_v1_bases()
        if bases is not None:
            return _create_cgroup_v1(bases, label, memory_mb, pids_limit, cpus, uid, gid)
        if mode == "cgroup":
            raise SandboxError(
                "limits='cgroup' needs writable cgroup v1 'memory' and 'pids' hierarchies "
                "under /sys/fs/cgroup (run as root on a cgroup v1 or hybrid host), "
                "or use limits='rlimit'"
            )
        _log_fallback_once()
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        logger.warning(
            "prlimit (util-linux) not found: sandbox memory_mb and pids_limit are NOT enforced"
        )
        return LimitGroup("none", ())
    return LimitGroup("rlimit", (prlimit, f"--as={memory_mb * MIB}", f"--nproc={pids_limit}", "--"))


@functools.lru_cache(maxsize=1)
def _log_fallback_once() -> None:
    logger.warning(
        "cgroup v1 memory/pids controllers are not writable; sandboxes fall back to "
        "rlimits (per-process address space, per-user process count)"
    )
