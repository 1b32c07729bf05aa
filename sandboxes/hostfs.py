"""Host-side file access to a sandbox's working directory, safe against escapes.

The working directory is a host directory bound into the sandbox, so the sandboxed command
can put anything there, symlinks to host files included. Reading or writing it from the host
must never leave it: paths are normalised lexically (``..`` may not climb out), and the
path is then walked one component at a time with ``O_NOFOLLOW`` relative to the directory
file descriptor of the previous one, so a symlink anywhere in the path (planted before or
during the call) is refused rather than followed. Only regular files are read or written
(a FIFO planted by the command cannot block the host).
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import shutil
import stat
from pathlib import Path

from agentrl.errors import SandboxError

logger = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def workdir_components(path: str, workdir: str) -> list[str]:
    """Split ``path`` (as the sandbox sees it) into components below ``workdir``.

    Relative paths are taken relative to ``workdir``; absolute ones must lie under it.

    Raises:
        SandboxError: the path leaves ``workdir`` (``../../etc/passwd``, ``/etc/passwd``),
            names ``workdir`` itself, is empty, or contains a NUL byte.
    """
    if not isinstance(path, str):
        raise SandboxError(f"path={path!r} must be a str")
    if not path or "\0" in path:
        raise SandboxError(f"path={path!r} is empty or contains a NUL byte")
    full = posixpath.normpath(posixpath.join(workdir, path))
    rel = posixpath.relpath(full, workdir)
    if rel == "." or rel == ".." or rel.startswith("../"):
        raise SandboxError(
            f"path={path!r} resolves to {full!r}, outside the sandbox working directory "
            f"{workdir!r} (only files under it can be read or written from the host)"
        )
    return rel.split("/")


def _open_parent(
    root: Path, components: list[str], *, create: bool, owner: tuple[int, int] | None = None
) -> int:
    """Open the directory holding the last component, never following a symlink.
    Raises OSError (ELOOP/ENOTDIR for a symlink on the way)."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in components[:-1]:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                if owner is not None:
                    os.fchown(nfd, *owner)
            os.close(fd)
            fd = nfd
    except OSError:
        os.close(fd)
        raise
    return fd


def _sandbox_error(exc: OSError, op: str, path: str) -> SandboxError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return SandboxError(
            f"{op}({path!r}): a path component is a symlink or not a directory; symlinks in "
            f"the working directory are never followed from the host ({exc.strerror})"
        )
    return SandboxError(f"{op}({path!r}) failed: {exc}")


def read_beneath(root: Path, components: list[str], path: str) -> bytes:
    """Read a regular file at ``root/components`` without following symlinks.

    Raises:
        SandboxError: missing file (the ``FileNotFoundError`` message is in it), a symlink
            or special file on the way, or any other OS error.
    """
    try:
        dfd = _open_parent(root, components, create=False)
        try:
            fd = os.open(
                components[-1],
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=dfd,
            )
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxError(f"read_file({path!r}): not a regular file")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _sandbox_error(exc, "read_file", path) from exc


def write_beneath(
    root: Path,
    components: list[str],
    path: str,
    data: bytes,
    *,
    owner: tuple[int, int] | None = None,
) -> None:
    """Create or replace a regular file at ``root/components`` (missing parent directories
    are created, mode 0755; the file gets mode 0644) without following symlinks.

    ``owner`` (uid, gid) is given to the file and to the directories created, so that the
    sandbox's user can change them.

    Raises:
        SandboxError: a symlink or special file on the way, or any OS error.
    """
    try:
        dfd = _open_parent(root, components, create=True, owner=owner)
        try:
            fd = os.open(
                components[-1],
                os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                0o644,
                dir_fd=dfd,
            )
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxError(f"write_file({path!r}): not a regular file")
            if owner is not None:
                os.fchown(fd, *owner)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    except OSError as exc:
        raise _sandbox_error(exc, "write_file", path) from exc


def force_rmtree(path: Path) -> bool:
    """Delete a sandbox's host directory, even after the command made parts of it
    unreadable (``chmod 000``). Symlinks are removed, never followed. Returns True when the
    directory is gone; logs what could not be removed."""
    if not os.path.lexists(path):
        return True
    if os.getuid() != 0:  # root is not stopped by permissions; others may be
        for dirpath, dirnames, _ in os.walk(path, onerror=lambda e: None):
            for d in dirnames:
                p = os.path.join(dirpath, d)
                if not os.path.islink(p):
                    try:
                        os.chmod(p, 0o700)
                    except OSError:
                        pass

    failures: list[str] = []

    def onerror(func: object, p: str, exc_info: object) -> None:
        exc = exc_info[1]  # type: ignore[index]
        if not isinstance(exc, FileNotFoundError):
            failures.append(f"{p}: {exc}")

    shutil.rmtree(path, onerror=onerror)
    if failures:
        logger.warning("could not fully remove %s: %s", path, "; ".join(failures[:5]))
    return not os.path.lexists(path)
