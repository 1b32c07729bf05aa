"""One exec inside a sandbox container: the shell wrapper the command runs under (its
timeout and the clean-up scan for processes carrying the exec's marker), and the
multiplexed stdin/stdout/stderr stream of the exec's socket. The careful core of the Docker
backend (``sandboxes.docker.sandbox``); see its module docstring for the whole design.
"""

from __future__ import annotations

import selectors
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
# It reads each /proc/<pid>/environ with builtins only: bash exactly, entry by entry
# (read -d ''); the POSIX fallback for images without bash line by line, where `read`
# drops the NUL separators, so it looks for the marker as a substring (an exec id has a
# fixed length, so no other exec's marker contains this one's).
#
# An escapee that is exec'ing while the scan reads it is the hard case (`setsid sh -c
# 'sleep N' &` exec's setsid, then sh, then sleep): /proc/<pid>/environ then reads empty
# (the kernel has installed the new address space but not yet written its stack, or the
# file was opened on the old one), or cut short (the shell reads it in several read(2)
# calls, and the exec falls between two). Such a process was not seen as marked, the pass
# found nothing, and it outlived its exec (4 of 150 such execs on a loaded 2-core machine).
# So the scan takes the process's image from /proc/<pid>/stat before and after reading its
# environment (command name, env_start and env_end: fields 2, 50 and 51; a new image has a
# new stack) and trusts a read without the marker only when the image stayed the same and
# the environment was read (or is really empty: env_start == env_end, it scrubbed the
# marker, see above). Otherwise the pass is unsure (``e``) and the wrapper scans again, for
# at most about 5 s (bash's clock; the POSIX fallback: 2000 passes). Zombies are skipped;
# processes of other users (the image's root ones) are not readable and not ours.
_IMAGE = (
    'envspan() { es=; ee=; [ $# -ge 49 ] || return 0; shift 47; es=$1; ee=$2; }; '
    'image() { img=; read -r st < "$1/stat" || { img=dead; return 0; }; r=${st##*") "}; '
    'case $r in Z*|X*) img=dead; return 0;; esac; envspan $r; '
    '[ -n "$ee" ] && [ "$ee" != 0 ] && img="${st%%") "*} $es $ee"; return 0; }; '
    'trust() { image "$1"; [ "$img" = dead ] && return 0; '
    '[ -n "$a" ] && [ "$a" = "$img" ] && { [ -n "$m" ] || [ "$es" = "$ee" ]; }; }; '
)
_KILL = 'kill -9 "${p##*/}" && f=1 && k="$k ${p##*/}"'
_SCAN_BASH = _IMAGE + (
    'scan() { f=; e=; for p in "$P"/[0-9]*; do [ "${p##*/}" = "$$" ] && continue; [ -r "$p/environ" ] || continue; '
    'image "$p"; [ "$img" = dead ] && continue; a=$img; m=; '
    'while IFS= read -r -d "" kv; do [ "$kv" = "AGENTRL_EXEC_ID=$1" ] && { m=hit; break; }; m=1; done < "$p/environ"; '
    f'if [ "$m" = hit ]; then {_KILL}; else trust "$p" || e=1; fi; done; }}; '
    'more() { if [ -n "$f" ]; then [ $n -lt 100 ]; else [ -n "$e" ] && [ $SECONDS -lt $d ]; fi; }; '
)
_SCAN_SH = _IMAGE + (
    'scan() { f=; e=; for p in "$P"/[0-9]*; do [ "${p##*/}" = "$$" ] && continue; [ -r "$p/environ" ] || continue; '
    'image "$p"; [ "$img" = dead ] && continue; a=$img; m=; '
    'while IFS= read -r x || [ -n "$x" ]; do case $x in *"AGENTRL_EXEC_ID=$1"*) m=hit; break;; esac; m=1; x=; '
    'done < "$p/environ"; '
    f'if [ "$m" = hit ]; then {_KILL}; else trust "$p" || e=1; fi; done; }}; '
    'more() { if [ -n "$f" ]; then [ $n -lt 100 ]; else [ -n "$e" ] && [ $n -lt 2000 ]; fi; }; '
)
# Passes of ``scan`` until one finds no marked process (at most 100 that find some) and
# no process is caught mid-execve (bash: for about 5 s; POSIX: 2000 passes). ``k`` collects
# the killed pids for ``reap_wait``. $2, the process table, is /proc but in tests.
_SCAN_ALL = 'scan_all() { P=${2:-/proc}; k=; n=0; d=$((SECONDS+5)); while :; do n=$((n+1)); scan "$1"; more || break; done; }; '
# `kill -9` returns before its target is gone: under load a killed escapee can still be
# listed (running, its SIGKILL pending) when the exec returns. ``reap_wait`` spins, with
# builtins only (no fork, no sleep binary), until every pid the scan killed has left
# /proc or is a zombie (dead, waiting for the container's init to reap it). bash bounds the
# wait by its clock ($SECONDS: 4-5 s for all pids together), so a slow machine does not
# end it early; the POSIX fallback has no clock without forking and counts reads per pid.
_REAP_WAIT_BASH = (
    'reap_wait() { d=$((SECONDS+5)); for q in $k; do while [ $SECONDS -lt $d ] && read -r st < "/proc/$q/stat"; do '
    'st=${st##*") "}; [ "${st%% *}" = Z ] && break; done 2>/dev/null; done; }; '
)
_REAP_WAIT_SH = (
    'reap_wait() { for q in $k; do i=0; while [ $i -lt 200000 ] && read -r st < "/proc/$q/stat"; do '
    'st=${st##*") "}; [ "${st%% *}" = Z ] && break; i=$((i+1)); done 2>/dev/null; done; }; '
)
RUN_AND_SCAN = (
    'id=$1; t=$2; shift 2; exec 3>&2 2>/dev/null; '
    '(exec 2>&3 3>&- timeout -s KILL "$t" /bin/sh -c \'exec "$@"\' sh "$@"); rc=$?; '
    'scan_all "$id"; reap_wait; exit $rc'
)
# Run from outside, as the sandbox's user (root without capabilities may neither read the
# user's /proc/<pid>/environ nor signal its processes): kill every process of one exec,
# the wrapper included.
KILL_ONLY = 'exec 2>/dev/null; scan_all "$1"; reap_wait; exit 0'
# Starts bash when the image has it, else sh (both scans are fork-free).
_LAUNCH = 'b=$1; s=$2; shift 2; [ -x /bin/bash ] && exec /bin/bash -c "$b" sh "$@"; exec /bin/sh -c "$s" sh "$@"'


def definitions(bash: bool) -> str:
    """The shell functions the wrapper's bodies use (``scan``, ``scan_all``, ``reap_wait``
    and their helpers), for bash (``bash=True``) or for a POSIX ``sh``. ``scan`` reads the
    process table under ``$P``; ``scan_all <exec id> [<proc root>]`` sets it (default
    ``/proc``)."""
    if bash:
        return _SCAN_BASH + _SCAN_ALL + _REAP_WAIT_BASH
    return _SCAN_SH + _SCAN_ALL + _REAP_WAIT_SH


def launch(body: str, *args: str) -> list[str]:
    """argv running ``body`` (after the ``definitions``) with ``args`` as ``$1...``: under
    bash when the image has it, else under ``/bin/sh``."""
    return ["/bin/sh", "-c", _LAUNCH, "sh", definitions(True) + body, definitions(False) + body, *args]


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
    # a selector, not select.select(): that refuses file descriptors >= 1024 (FD_SETSIZE),
    # which a process with many open files (a rollout worker serving 96 agents through the
    # gateway) hands out, and every exec then failed ("filedescriptor out of range")
    with selectors.DefaultSelector() as sel:
        sel.register(raw, selectors.EVENT_READ | (selectors.EVENT_WRITE if pending is not None else 0))
        return _pump(sel, raw, pending, out, err, deadline)


def _pump(sel: selectors.BaseSelector, raw: socket.socket, pending: memoryview | None, out: BoundedOutput,
          err: BoundedOutput, deadline: float) -> str:
    buf = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "deadline"
        events = 0
        for _key, mask in sel.select(remaining):
            events |= mask
        readable, writable = events & selectors.EVENT_READ, events & selectors.EVENT_WRITE
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
            if pending is None:
                sel.modify(raw, selectors.EVENT_READ)
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
