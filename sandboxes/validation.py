"""Checks of ``SandboxSpec`` values and exec arguments shared by sandbox backends.

Every check raises ``ConfigError`` naming the value and what was expected.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from collections.abc import Mapping, Sequence

from agentrl.errors import ConfigError
from sandboxes.base import SandboxSpec
from sandboxes.labels import validate_run_id

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_MOUNTS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/dev",
    "/sys",
)
"""Paths the sandbox's own filesystem layout owns; ``workdir`` may not be one or lie
under one."""

MIN_MEMORY_MB = 16
MIN_PIDS = 8


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_env(env: Mapping[str, str], what: str) -> dict[str, str]:
    """Return ``env`` as a dict after checking names (``[A-Za-z_][A-Za-z0-9_]*``) and
    values (``str`` without NUL). ``what`` names the source in error messages."""
    if not isinstance(env, Mapping):
        raise ConfigError(f"{what}={env!r} must be a mapping of str to str")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            raise ConfigError(
                f"{what} key {key!r} is not a valid environment variable name "
                "([A-Za-z_][A-Za-z0-9_]*)"
            )
        if not isinstance(value, str) or "\0" in value:
            raise ConfigError(f"{what}[{key!r}]={value!r} must be a str without NUL bytes")
        out[key] = value
    return out


def validate_spec(spec: SandboxSpec) -> SandboxSpec:
    """Check every field of ``spec``; return it unchanged.

    Raises:
        ConfigError: the first invalid field, e.g. ``memory_mb=0 must be an integer >= 16
            (MiB)``.
    """
    if not isinstance(spec, SandboxSpec):
        raise ConfigError(f"spec={spec!r} must be a sandboxes.SandboxSpec")
    if not _is_int(spec.memory_mb) or spec.memory_mb < MIN_MEMORY_MB:
        raise ConfigError(f"memory_mb={spec.memory_mb!r} must be an integer >= {MIN_MEMORY_MB} (MiB)")
    if not _is_int(spec.pids_limit) or spec.pids_limit < MIN_PIDS:
        raise ConfigError(
            f"pids_limit={spec.pids_limit!r} must be an integer >= {MIN_PIDS} (the sandbox's "
            "own init and monitor processes count)"
        )
    if not isinstance(spec.cpus, (int, float)) or not math.isfinite(spec.cpus) or spec.cpus <= 0:
        raise ConfigError(f"cpus={spec.cpus!r} must be a finite number of cores > 0")
    if spec.network not in ("none", "host", "bridge"):
        raise ConfigError(f"network={spec.network!r}; expected 'none', 'host' or 'bridge' (Docker only)")
    if not isinstance(spec.writable_root, bool):
        raise ConfigError(f"writable_root={spec.writable_root!r} must be a bool")
    w = spec.workdir
    if not isinstance(w, str) or not w.startswith("/") or posixpath.normpath(w) != w or w == "/":
        raise ConfigError(
            f"workdir={w!r} must be a normalised absolute path other than '/' (e.g. '/work')"
        )
    for reserved in RESERVED_MOUNTS:
        if w == reserved or w.startswith(reserved + "/"):
            raise ConfigError(
                f"workdir={w!r} lies in {reserved}, which the sandbox mounts itself; "
                "choose e.g. '/work'"
            )
    if not _is_int(spec.output_limit_bytes) or spec.output_limit_bytes < 0:
        raise ConfigError(f"output_limit_bytes={spec.output_limit_bytes!r} must be an integer >= 0")
    validate_timeout(spec.default_timeout_s, "default_timeout_s")
    validate_run_id(spec.run_id)
    validate_env(spec.env, "env")
    validate_ro_mounts(spec.ro_mounts, w)
    validate_tmpfs_dirs(spec.tmpfs_dirs, w, tuple(inside for _, inside in spec.ro_mounts))
    return spec


def validate_tmpfs_dirs(dirs: object, workdir: str, mounted: Sequence[str] = ()) -> None:
    """Check ``SandboxSpec.tmpfs_dirs``: normalised absolute paths other than ``/``, outside
    the sandbox's own layout (``RESERVED_MOUNTS``, ``/tmp``, the working directory) and the
    ``mounted`` paths (the read-only mounts'), none inside another, each named once.

    Raises:
        ConfigError: the first bad path, named.
    """
    if isinstance(dirs, (str, bytes)) or not isinstance(dirs, Sequence):
        raise ConfigError(f"tmpfs_dirs={dirs!r} must be a sequence of absolute paths, e.g. ('/logs',)")
    seen: list[str] = []
    for path in dirs:
        if not isinstance(path, str) or not path.startswith("/") or posixpath.normpath(path) != path \
                or path == "/" or "\0" in path:
            raise ConfigError(f"tmpfs_dirs entry {path!r} must be a normalised absolute path other than '/'")
        for owned in RESERVED_MOUNTS + ("/tmp", workdir, *mounted, *seen):
            if path == owned or path.startswith(owned + "/") or owned.startswith(path + "/"):
                raise ConfigError(f"tmpfs_dirs entry {path!r} overlaps {owned}, which the sandbox mounts "
                                  "already; choose e.g. '/logs'")
        seen.append(path)


def validate_ro_mounts(mounts: object, workdir: str) -> None:
    """Check ``SandboxSpec.ro_mounts``: a sequence of ``(host path, sandbox path)`` pairs, both
    normalised absolute paths, the host path existing here, the sandbox path outside the sandbox's own layout
    (``RESERVED_MOUNTS``, ``/tmp``, the working directory) and used once.

    Raises:
        ConfigError: the first bad pair, named.
    """
    if isinstance(mounts, (str, bytes)) or not isinstance(mounts, Sequence):
        raise ConfigError(f"ro_mounts={mounts!r} must be a sequence of (host path, sandbox path) pairs")
    seen: set[str] = set()
    for pair in mounts:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ConfigError(f"ro_mounts entry {pair!r} must be a (host path, sandbox path) pair")
        for path in pair:
            if not isinstance(path, str) or not path.startswith("/") or posixpath.normpath(path) != path \
                    or path == "/" or "\0" in path:
                raise ConfigError(f"ro_mounts entry {pair!r}: {path!r} must be a normalised absolute path "
                                  "other than '/'")
        if not os.path.exists(pair[0]):
            raise ConfigError(f"ro_mounts entry {pair!r}: the host path {pair[0]!r} does not exist on this machine")
        inside = pair[1]
        for owned in RESERVED_MOUNTS + ("/tmp", workdir):
            if inside == owned or inside.startswith(owned + "/") or owned.startswith(inside + "/"):
                raise ConfigError(f"ro_mounts entry {pair!r}: {inside!r} overlaps {owned}, which the sandbox "
                                  "mounts itself; choose e.g. '/run/<name>' or '/opt/<name>'")
        if inside in seen:
            raise ConfigError(f"ro_mounts names {inside!r} twice")
        seen.add(inside)


def validate_timeout(timeout_s: object, what: str = "timeout_s") -> float:
    """Return ``timeout_s`` as a float after checking it is finite and > 0 (seconds)."""
    if (
        not isinstance(timeout_s, (int, float))
        or isinstance(timeout_s, bool)
        or not math.isfinite(timeout_s)
        or timeout_s <= 0
    ):
        raise ConfigError(f"{what}={timeout_s!r} must be a finite number of seconds > 0")
    return float(timeout_s)


def normalize_command(command: str | Sequence[str]) -> tuple[str | tuple[str, ...], list[str]]:
    """``(as recorded in ExecResult.command, argv to run)``: a string runs as
    ``/bin/sh -c command``; a sequence is the argv itself.

    Raises:
        ConfigError: empty argv, a non-str element, or a NUL byte.
    """
    if isinstance(command, str):
        if "\0" in command:
            raise ConfigError(f"command={command!r} contains a NUL byte")
        return command, ["/bin/sh", "-c", command]
    if isinstance(command, (bytes, bytearray)) or not isinstance(command, Sequence):
        raise ConfigError(
            f"command={command!r} must be a shell string or a sequence of str (argv)"
        )
    argv = list(command)
    if not argv:
        raise ConfigError("command=[] is empty; expected a shell string or a non-empty argv")
    for arg in argv:
        if not isinstance(arg, str) or "\0" in arg:
            raise ConfigError(f"command argument {arg!r} must be a str without NUL bytes")
    return tuple(argv), argv
