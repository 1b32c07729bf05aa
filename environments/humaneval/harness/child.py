"""HumanEval test process: runs the candidate, and nothing else. Runs INSIDE the sandbox as
``python3 -I -c <codec.py + this file>``, started by ``supervisor.py``; standard library only.

Reads one job as JSON on stdin (``prompt``, ``solution``, ``entry_point``, ``memory_mb``,
``token``, ``report_fd``, ``request_fd``), loads prompt + solution, then answers calls until
``request_fd`` ends: each request is one line ``[call_id, args, kwargs]`` (values in the
tagged form of ``codec.py``). It writes one JSON list per line on ``report_fd``, each
``[token, kind, *args]``: ``hello``; ``internal detail`` when this process itself broke
before it ran any submitted code (setting limits, running the task's prompt), else
``loading`` right before the solution runs; then ``ready`` or ``loaderr detail exited``;
then per call ``result call_id value``, ``raise call_id detail exited`` (``exited``: the
candidate raised ``SystemExit``, ``KeyboardInterrupt`` or another non-``Exception``),
``foreign call_id type_name judge_override`` (the result is not a plain builtin value) or
``unsendable call_id detail``. From ``loading`` on, the submission's code shares this
process (it can reach ``send`` on the stack), so the supervisor takes nothing this process
says or fails to say after ``loading`` as the harness's own fault. It never sees the test
code: the test's assertions run in the supervisor, on values rebuilt there. Its own stdout
and stderr go to ``/dev/null``.
"""

import json
import os
import sys
import traceback


def main():
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    _fd = int(job["report_fd"])
    _request_fd = int(job["request_fd"])
    _token = job["token"]
    _dumps, _loads, _write, _read = json.dumps, json.loads, os.write, os.read
    _isinstance, _str, _type, _exc_base = isinstance, str, type, Exception
    _to_tagged, _from_tagged, _foreign = to_tagged, from_tagged, ForeignValue  # noqa: F821 (codec.py)

    def describe(exc):
        try:
            name = _str(_type(exc).__name__)
            text = _str(exc)
            return f"{name}: {text}"[:500] if text else name[:500]
        except BaseException:
            return "an exception that cannot be printed"

    def send(*msg):
        data = (_dumps([_token, *msg]) + "\n").encode("utf-8")
        while data:
            data = data[_write(_fd, data):]

    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        send("hello")
        memory_mb = job.get("memory_mb")
        if memory_mb:
            import resource

            limit = int(memory_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
        except OSError:
            pass
        entry = job["entry_point"]
        ns = {"__name__": "__solution__"}
        exec(compile(job["prompt"], "<prompt>", "exec"), ns)
        stub = ns.get(entry)
    except BaseException:
        send("internal", traceback.format_exc()[-2000:])
        return
    send("loading")
    try:
        exec(compile(job["solution"], "<solution>", "exec"), ns)
        candidate = ns.get(entry)
        if candidate is None or candidate is stub:
            send("loaderr", f"the solution does not define the function {entry}()", False)
            return
        if not callable(candidate):
            send("loaderr", f"{entry} is not a function", False)
            return
    except BaseException as exc:
        send("loaderr", describe(exc), not _isinstance(exc, _exc_base))
        return
    send("ready")
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = _read(_request_fd, 1 << 16)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        call_id, args, kwargs = _loads(line.decode("utf-8"))
        args, kwargs = _from_tagged(args), _from_tagged(kwargs)
        try:
            value = candidate(*args, **kwargs)
        except BaseException as exc:
            send("raise", call_id, describe(exc), not _isinstance(exc, _exc_base))
            continue
        try:
            send("result", call_id, _to_tagged(value))
        except _foreign as exc:
            send("foreign", call_id, exc.type_name, exc.judge_override)
        except BaseException as exc:
            send("unsendable", call_id, describe(exc))


if __name__ == "__main__":
    main()
