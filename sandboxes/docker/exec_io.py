"""One exec inside a sandbox container: the shell wrapper the command runs under (its
timeout and the clean-up scan for processes carrying the exec's marker), and the
multiplexed stdin/stdout/stderr stream of the exec's socket. The careful core of the Docker
backend (``sandboxes.docker.sandbox``); see its module docstring for the whole design.
"""

from __future__ import annotations

import select
import socket
import struct
import time

from sandboxes.output import BoundedOutput

_READ_CHUNK = 1 << 16

# $1 = exec id, $2 = timeout (s), rest = the command. The command's stderr is its own; the
# wrapper's messages go nowhere. After the command (or its timeout), every process still
# carrying this exec's marker dies: setsid/nohup escapees do not outlive their exec. The scan
# repeats until a pass finds none (a process forked during a pass is seen by the next one).
# A process that scrubs the marker from its own environment is not found; it lives until the
# sandbox is closed (or its pool reset), which is where the bubblewrap backend, with a pid
# namespace per exec, is stricter.
#
# The scan must not fork: after a fork bomb has used up the container's pids limit, every
# `grep` the scan started failed, the pass "found" nothing and the bomb outlived its exec.
# With bash the scan reads each /proc/<pid>/environ with builtins only (read -d ''). Images
# without bash fall back to the POSIX version, which needs one grep per process.
_SCAN_BASH = (
    'scan() { f=; for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; '
    'while IFS= read -r -d "" kv; do [ "$kv" = "AGENTRL_EXEC_ID=$1" ] && '
    '{ kill -9 "${p#/proc/}" && f=1 && k="$k ${p#/proc/}"; break; }; done < "$p/environ"; done; }; '
)
_SCAN_SH = (
    'scan() { f=; for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; '
    'grep -qsxz "AGENTRL_EXEC_ID=$1" "$p/environ" && kill -9 "${p#/proc/}" && f=1 && k="$k ${p#/proc/}"; done; }; '
)
# `kill -9` returns before its target is gone: under load a killed escapee can still be
# listed (running, its SIGKILL pending) when the exec returns. ``reap_wait`` spins, with
# builtins only (no fork, no sleep binary), until every pid the scan killed has left
# /proc or is a zombie (dead, waiting for the container's init to reap it), for at most
# 20000 reads of its stat line per pid (a few hundred ms in all under load).
_REAP_WAIT = (
    'reap_wait() { for q in $k; do i=0; while [ $i -lt 20000 ] && read -r st < "/proc/$q/stat"; do '
    'st=${st##*") "}; [ "${st%% *}" = Z ] && break; i=$((i+1)); done 2>/dev/null; done; }; '
)
RUN_AND_SCAN = (
    'id=$1; t=$2; shift 2; exec 3>&2 2>/dev/null; '
    '(exec 2>&3 3>&- timeout -s KILL "$t" /bin/sh -c \'exec "$@"\' sh "$@"); rc=$?; '
    'k=; n=0; while [ $n -lt 100 ]; do n=$((n+1)); scan "$id"; [ -z "$f" ] && break; done; '
    'reap_wait; exit $rc'
)
# Run as root from outside: kill every process of one exec (wrapper included).
KILL_ONLY = 'exec 2>/dev/null; k=; scan "$1"; reap_wait; exit 0'
# Starts bash with the fork-free scan when the image has it, else sh with the grep scan.
_LAUNCH = 'b=$1; s=$2; shift 2; [ -x /bin/bash ] && exec /bin/bash -c "$b" sh "$@"; exec /bin/sh -c "$s" sh "$@"'


def launch(body: str, *args: str) -> list[str]:
    """argv running ``body`` (after ``scan``'s definition) with ``args`` as ``$1...``."""
    return ["/bin/sh", "-c", _LAUNCH, "sh", _SCAN_BASH + _REAP_WAIT + body, _SCAN_SH + _REAP_WAIT + body, *args]


def pump(
    raw: socket.socket, stdin_bytes: bytes | None, out: BoundedOutput, err: BoundedOutput,
    deadline: float,
) -> str:
    """Feed ``stdin_bytes`` to the exec's socket ``raw`` and read its multiplexed frames
    (stream 1 into ``out``, 2 into ``err``) until EOF (returns ``"eof"``) or the
    ``time.monotonic()`` ``deadline`` in seconds (returns ``"deadline"``). An empty
    ``stdin_bytes`` closes the command's stdin at once; ``None`` sends nothing.

    Raises:
        OSError: the socket failed (the caller decides whose fault that is).
    """
    raw.setblocking(False)
    pending = memoryview(stdin_bytes) if stdin_bytes else None
    if stdin_bytes is not None and not stdin_bytes:
        raw.shutdown(socket.SHUT_WR)
    buf = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "deadline"
        wlist = [raw] if pending is not None else []
        readable, writable, _ = select.select([raw], wlist, [], remaining)
        if writable:
            try:
                n = raw.send(pending[:_READ_CHUNK])
            except BlockingIOError:
                n = 0
            except (BrokenPipeError, ConnectionResetError):
                pending = None
                n = 0
            if pending is not None:
                pending = pending[n:]
                if len(pending) == 0:
                    pending = None
                    raw.shutdown(socket.SHUT_WR)
        if readable:
            try:
                data = raw.recv(_READ_CHUNK * 4)
            except BlockingIOError:
                continue
            if not data:
                return "eof"
            buf += data
            # Frames: 1 byte stream, 3 zero bytes, 4 bytes big-endian length, payload.
            pos = 0
            while len(buf) - pos >= 8:
                kind, size = struct.unpack_from(">BxxxL", buf, pos)
                if len(buf) - pos - 8 < size:
                    break
                payload = bytes(buf[pos + 8:pos + 8 + size])
                (err if kind == 2 else out).feed(payload)
                pos += 8 + size
            if pos:
                del buf[:pos]
