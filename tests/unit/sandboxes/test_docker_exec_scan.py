"""The Docker exec wrapper's clean-up scan (sandboxes/docker/exec_io.py), run by bash and by
the POSIX ``sh`` on a made-up process table: which processes it kills, which it lets be,
and when it is unsure and must scan again.

The unsure cases are the ones a real container shows only now and then: a process caught
in the middle of execve() has an environment that reads empty (env_end still 0) or is cut
short (the image changed between two reads). Before the scan looked at the image, such a
process carrying the exec's marker was let be and outlived its exec (C10, seen in CI). The
real-container tests are in tests/integration/sandboxes/ (test_contract.py,
test_docker_sandbox.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from sandboxes.docker.exec_io import definitions

EXEC_ID = "0123456789abcdef0123456789abcdef"
OTHER_ID = "fedcba9876543210fedcba9876543210"
SHELLS = ["bash", "sh"]


def stat_line(pid: int, comm: str = "sleep", state: str = "S", env: tuple[int, int] = (7000, 7100)) -> str:
    """A /proc/<pid>/stat line: 52 fields, env_start and env_end at fields 50 and 51."""
    fields = [str(pid), f"({comm})", state] + ["0"] * 49
    fields[49], fields[50] = str(env[0]), str(env[1])
    return " ".join(fields) + "\n"


def add_proc(root: Path, pid: int, environ: bytes | None, **stat) -> Path:
    d = root / str(pid)
    d.mkdir()
    (d / "stat").write_text(stat_line(pid, **stat))
    if environ is not None:
        (d / "environ").write_bytes(environ)
    return d


def env(*entries: str) -> bytes:
    return b"".join(e.encode() + b"\0" for e in entries)


def run_scan(shell: str, root: Path) -> dict[str, str]:
    """One pass of ``scan`` over ``root`` with ``kill`` replaced by a no-op that succeeds;
    returns the wrapper's variables f (found), e (unsure) and k (killed pids)."""
    script = definitions(shell == "bash") + 'kill() { return 0; }; P=$1; k=; scan "$2"; echo "f=$f;e=$e;k=$k"'
    exe = shutil.which(shell)
    assert exe, f"{shell} is needed by this test"
    out = subprocess.run([exe, "-c", script, "scan", str(root), EXEC_ID], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return dict(part.split("=", 1) for part in out.stdout.strip().split(";"))


@pytest.mark.parametrize("shell", SHELLS)
def test_marked_processes_are_killed_and_others_let_be(shell, tmp_path):
    add_proc(tmp_path, 11, env("PATH=/bin", f"AGENTRL_EXEC_ID={EXEC_ID}", "HOME=/work"))
    add_proc(tmp_path, 12, env("PATH=/bin", f"AGENTRL_EXEC_ID={OTHER_ID}"))  # another exec's
    add_proc(tmp_path, 13, env("PATH=/bin"))  # no marker, read whole, image unchanged
    # an earlier value with a newline: the POSIX scan reads line by line and must go on
    add_proc(tmp_path, 14, env("NOTE=two\nlines", f"AGENTRL_EXEC_ID={EXEC_ID}"))
    got = run_scan(shell, tmp_path)
    assert sorted(got["k"].split()) == ["11", "14"]
    assert got["f"] == "1" and got["e"] == ""


@pytest.mark.parametrize("shell", SHELLS)
def test_zombies_and_really_empty_environments_are_let_be(shell, tmp_path):
    add_proc(tmp_path, 21, env(f"AGENTRL_EXEC_ID={EXEC_ID}"), state="Z")  # dead already
    add_proc(tmp_path, 22, b"", env=(7000, 7000))  # env -i: env_start == env_end != 0
    got = run_scan(shell, tmp_path)
    assert got == {"f": "", "e": "", "k": ""}


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    "case", ["mid-exec: no stack yet", "empty read of a non-empty environment"],
)
def test_an_environment_that_reads_empty_makes_the_pass_unsure(shell, case, tmp_path):
    span = (0, 0) if case.startswith("mid-exec") else (7000, 7100)
    add_proc(tmp_path, 31, b"", env=span)
    got = run_scan(shell, tmp_path)
    assert got == {"f": "", "e": "1", "k": ""}


@pytest.mark.parametrize("shell", SHELLS)
def test_an_image_that_changes_while_its_environment_is_read_makes_the_pass_unsure(shell, tmp_path):
    """The read returns two entries, no marker; by the time it ends the process has exec'd
    (new command name, new stack). Taken as whole before, it was let be."""
    d = add_proc(tmp_path, 41, None, comm="setsid", env=(7000, 7300))
    os.mkfifo(d / "environ")

    def writer():
        with open(d / "environ", "wb") as fifo:  # opens when the scan starts reading
            fifo.write(env("PATH=/bin", "HOSTNAME=sandbox"))
            fifo.flush()
            (d / "stat").write_text(stat_line(41, comm="sh", env=(9000, 9300)))
        # closing is the end of the read: after the image changed

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    got = run_scan(shell, tmp_path)
    t.join(timeout=10)
    assert got == {"f": "", "e": "1", "k": ""}


@pytest.mark.parametrize("shell", SHELLS)
def test_scan_all_gives_up_on_an_unsure_process_within_its_bound(shell, tmp_path):
    """A process that stays unsure (here: forever mid-exec) does not hang the exec: bash
    stops after about 5 s of its clock, the POSIX scan after 2000 passes."""
    add_proc(tmp_path, 51, b"", env=(0, 0))
    script = definitions(shell == "bash") + 'kill() { return 0; }; scan_all "$1" "$2"; echo "n=$n"'
    exe = shutil.which(shell)
    out = subprocess.run([exe, "-c", script, "scan", EXEC_ID, str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    n = int(out.stdout.strip().removeprefix("n="))
    assert n > 1  # it did scan again
    if shell == "sh":
        assert n == 2000
