"""HumanEval test process. Runs INSIDE the sandbox as ``python3 -I -c <this file>``, started
by ``supervisor.py``; standard library only.

Reads one job as JSON on stdin (``prompt``, ``solution``, ``test_program``, ``entry_point``,
``memory_mb``, ``start``, ``token``, ``report_fd``), loads prompt + solution + the
instrumented test module, runs the test cases from ``start`` on, and reports over the pipe
``report_fd``: one JSON list per line, ``[token, kind, *args]`` (see ``supervisor.py``).
Its own stdout and stderr go to ``/dev/null``.
"""

import json
import os
import sys
import traceback


def main():
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    _fd = int(job["report_fd"])
    _token = job["token"]
    _dumps, _write, _isinstance, _str, _type = json.dumps, os.write, isinstance, str, type

    def describe(exc):
        try:
            name = _str(_type(exc).__name__)
            text = _str(exc)
            return f"{name}: {text}"[:500] if text else name[:500]
        except BaseException:
            return "an exception that cannot be printed"

    def report(kind, index=None, detail=None):
        msg = [_token, kind]
        if index is not None:
            msg.append(index)
        if detail is not None:
            msg.append(describe(detail) if _isinstance(detail, BaseException) else _str(detail))
        data = (_dumps(msg) + "\n").encode("utf-8")
        while data:
            data = data[_write(_fd, data):]

    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        report("hello")
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
        prompt_code = compile(job["prompt"], "<prompt>", "exec")
        test_code = compile(job["test_program"], "<test>", "exec")
    except BaseException:
        report("internal", None, traceback.format_exc()[-2000:])
        return
    try:
        exec(prompt_code, ns)
        stub = ns.get(entry)
        exec(compile(job["solution"], "<solution>", "exec"), ns)
        candidate = ns.get(entry)
        if candidate is None or candidate is stub:
            report("loaderr", None, f"the solution does not define the function {entry}()")
            return
        if not callable(candidate):
            report("loaderr", None, f"{entry} is not a function")
            return
        exec(test_code, ns)
    except BaseException as exc:
        report("loaderr", None, exc)
        return
    report("ready")
    try:
        ns["__agentrl_check__"](candidate, report, int(job["start"]))
    except BaseException as exc:
        report("checkerr", None, exc)
        return
    report("done")


if __name__ == "__main__":
    main()
