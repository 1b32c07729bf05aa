"""The forwarder an agent command runs under inside its sandbox (standard library only: it
runs on the sandbox's own ``python3``, not agentrl's).

The sandbox has no network; the gateway's Unix socket is bound read-only into it
(``agentrl.gateway.server.SANDBOX_GATEWAY_DIR``). The forwarder, in the sandbox's own
network namespace:

1. reads its payload on stdin (JSON: ``{"task": {...}, "files": {name: text}}``) and writes
   the task to ``task.json`` and each file into a private directory under ``/tmp``;
2. opens the session's lifeline (``GET /sessions/<id>/lifeline`` over the socket, with the
   session's key from ``OPENAI_API_KEY``): a session that does not answer 200 stops here
   (exit 2, its reason on stderr);
3. listens on ``127.0.0.1:<free port>`` and copies every connection to the gateway's socket
   and back, byte for byte;
4. runs the command (``/bin/sh -c`` of it by the caller) with ``OPENAI_BASE_URL`` set to
   ``http://127.0.0.1:<port>/sessions/<id>/v1``, ``AGENTRL_TASK_FILE`` and
   ``AGENTRL_AGENT_DIR``, in a process group of its own, stdin from ``/dev/null``;
5. exits with the command's exit status (128 + N for a signal N), or, when the lifeline ends
   first (the episode is over, or the gateway is gone), kills the command's process group
   and exits 143.

Usage: ``python3 forward.py --socket PATH --session ID -- ARGV...``
"""

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

LIFELINE_ENDED_EXIT = 143
SESSION_REFUSED_EXIT = 2


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("gateway", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(listener, path):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError as exc:
            sys.stderr.write("agentrl-forward: the gateway socket %s does not answer: %s\n" % (path, exc))
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _write_payload(payload):
    agent_dir = tempfile.mkdtemp(prefix="agentrl-agent-")
    task_file = os.path.join(agent_dir, "task.json")  # agent_command.TASK_FILE_NAME
    for name, text in (payload.get("files") or {}).items():
        target = os.path.normpath(os.path.join(agent_dir, name))
        if not target.startswith(agent_dir + os.sep):
            raise ValueError("file name %r leaves the agent directory" % name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        if text.startswith("#!"):
            os.chmod(target, 0o755)
    with open(task_file, "w", encoding="utf-8") as f:  # last: no file can replace it
        json.dump(payload.get("task") or {}, f)
    return agent_dir, task_file


def main(argv=None):
    parser = argparse.ArgumentParser(prog="forward.py")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    key = os.environ.get("OPENAI_API_KEY", "")
    raw = sys.stdin.buffer.read()
    try:
        agent_dir, task_file = _write_payload(json.loads(raw.decode("utf-8")) if raw.strip() else {})
    except (OSError, ValueError) as exc:
        sys.stderr.write("agentrl-forward: could not write the task and the agent's files: %s\n" % exc)
        return SESSION_REFUSED_EXIT

    conn = _UnixConnection(args.socket, timeout=30)
    try:
        conn.request("GET", "/sessions/%s/lifeline" % args.session, headers={"Authorization": "Bearer " + key})
        lifeline = conn.getresponse()
    except OSError as exc:
        sys.stderr.write("agentrl-forward: the gateway socket %s does not answer: %s\n" % (args.socket, exc))
        return SESSION_REFUSED_EXIT
    if lifeline.status != 200:
        sys.stderr.write("agentrl-forward: session %s refused (HTTP %d): %s\n"
                         % (args.session, lifeline.status, lifeline.read(2000).decode("utf-8", "replace")))
        return SESSION_REFUSED_EXIT
    conn.sock.settimeout(None)

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    threading.Thread(target=_serve, args=(listener, args.socket), daemon=True).start()

    base_url = "http://127.0.0.1:%d/sessions/%s/v1" % (port, args.session)
    env = dict(os.environ, OPENAI_BASE_URL=base_url, OPENAI_API_BASE=base_url,
               AGENTRL_TASK_FILE=task_file, AGENTRL_AGENT_DIR=agent_dir)
    try:
        child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        sys.stderr.write("agentrl-forward: could not start %r: %s\n" % (command, exc))
        return 127
    ended = threading.Event()

    def watch():
        try:
            while lifeline.read(1):
                pass
        except (OSError, http.client.HTTPException):
            pass
        ended.set()
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass

    threading.Thread(target=watch, daemon=True).start()
    code = child.wait()
    if ended.is_set():
        sys.stderr.write("agentrl-forward: the session ended; the agent command was stopped\n")
        return LIFELINE_ENDED_EXIT
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
