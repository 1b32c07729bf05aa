"""``agentrl/HumanEval-v0`` and its grading harness, run in the real bubblewrap sandbox.

Every code path here executes in ``BwrapSandbox``: the canonical solutions of all 164
problems, wrong and hostile submissions, and whole episodes through ``gymnasium.make``.
"""

from __future__ import annotations

import json
import time
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import environments  # noqa: F401  (registers agentrl/HumanEval-v0)
from agentrl.errors import ConfigError, EnvError, RewardError, SandboxError
from agentrl.types import ExecResult
from environments.humaneval import HumanEvalEnv, get_task, load_tasks, score_solutions, task_ids
from environments.tools import ToolCall
from sandboxes import BwrapSandbox, SandboxSpec, make_sandbox

BELOW_ZERO_FALSE = "def below_zero(operations):\n    return False\n"
"""Wrong answer to HumanEval/3: passes exactly the 3 of 6 cases that expect False."""


@pytest.fixture(scope="module")
def sandbox():
    sb = make_sandbox("bwrap", SandboxSpec(run_id="test-env-humaneval", memory_mb=1024))
    assert isinstance(sb, BwrapSandbox)
    yield sb
    sb.close()


@pytest.fixture
def execs(sandbox):
    """Every ExecResult the sandbox produces during the test (its listener interface)."""
    seen: list[ExecResult] = []
    sandbox.add_listener(seen.append)
    yield seen
    sandbox.remove_listener(seen.append)


def tool(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def answer(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```"


# -- grading ------------------------------------------------------------------------------


def test_canonical_solutions_score_1_on_all_164_problems(sandbox, execs):
    items = [(tid, get_task(tid).canonical_program) for tid in task_ids("all")]
    t0 = time.monotonic()
    reports = score_solutions(sandbox, items, assertion_timeout_s=5.0, memory_mb=512)
    elapsed = time.monotonic() - t0
    assert len(reports) == 164
    failing = [(r.task_id, r.load_error, [o.detail for o in r.outcomes if not o.passed])
               for r in reports if r.reward != 1.0]
    assert failing == []
    assert sum(r.total for r in reports) == 1133
    assert all(r.attempts == 1 for r in reports)
    # Grouped: about ten sandbox execs for the whole dataset, not one per problem.
    assert 1 < len(execs) <= 20
    print(f"\n164 canonical solutions graded in {elapsed:.1f} s with {len(execs)} sandbox execs")
    assert elapsed < 120


# Eleven real problems, with a wrong solution that defines the function.
WRONG = {
    "HumanEval/0": "def has_close_elements(numbers, threshold):\n    return False\n",
    "HumanEval/3": BELOW_ZERO_FALSE,
    "HumanEval/13": "def greatest_common_divisor(a, b):\n    return 1\n",
    "HumanEval/31": "def is_prime(n):\n    return n % 2 == 1\n",
    "HumanEval/32": "def find_zero(xs):\n    return 0.0\n",
    "HumanEval/38": "def decode_cyclic(s):\n    return s\n",
    "HumanEval/44": "def change_base(x, base):\n    return str(x)\n",
    "HumanEval/53": "def add(x, y):\n    return x - y\n",
    "HumanEval/129": "def minPath(grid, k):\n    return [1] * k\n",
    "HumanEval/151": "def double_the_difference(lst):\n    return 0\n",
    "HumanEval/160": "def do_algebra(operator, operand):\n    return 0\n",
}


def test_wrong_and_empty_solutions_score_below_1(sandbox):
    wrong = score_solutions(sandbox, sorted(WRONG.items()), assertion_timeout_s=5.0)
    assert [r.task_id for r in wrong] == sorted(WRONG)
    assert all(r.reward < 1.0 for r in wrong), [(r.task_id, r.reward) for r in wrong]
    assert all(r.load_error is None for r in wrong)
    by_id = {r.task_id: r for r in wrong}
    assert (by_id["HumanEval/3"].passed, by_id["HumanEval/3"].total) == (3, 6)
    # HumanEval/160's `assert True` is not a case, so "return 0" earns nothing.
    assert by_id["HumanEval/160"].reward == 0.0

    empty = score_solutions(sandbox, [(tid, "") for tid in sorted(WRONG)])
    assert all(r.reward == 0.0 for r in empty)
    assert all("does not define the function" in (r.load_error or "") for r in empty)
    assert all(o.status == "not_run" for r in empty for o in r.outcomes)


def test_infinite_loop_scores_0_within_the_time_limit(sandbox):
    looping = "def below_zero(operations):\n    while True:\n        pass\n"
    t0 = time.monotonic()
    [report] = score_solutions(sandbox, [("HumanEval/3", looping)], assertion_timeout_s=0.5)
    elapsed = time.monotonic() - t0
    assert report.reward == 0.0
    assert [o.status for o in report.outcomes] == ["timeout"] * 6
    assert report.attempts == 6  # one fresh test process per timed-out case
    assert elapsed < 6 * 0.5 + 5.0, elapsed  # six limits plus start-up slack

    t0 = time.monotonic()
    [report] = score_solutions(sandbox, [("HumanEval/3", "while True:\n    pass\n")], assertion_timeout_s=0.5)
    assert report.reward == 0.0 and time.monotonic() - t0 < 5.0
    assert report.load_error == "loading the solution took more than 0.5 s"


def test_only_the_slow_case_times_out(sandbox):
    # Slow only on the empty list (the first case): the other five still pass.
    slow_on_empty = (
        "import time\n"
        "def below_zero(operations):\n"
        "    if not operations:\n"
        "        time.sleep(60)\n"
        "    total = 0\n"
        "    for op in operations:\n"
        "        total += op\n"
        "        if total < 0:\n"
        "            return True\n"
        "    return False\n"
    )
    [report] = score_solutions(sandbox, [("HumanEval/3", slow_on_empty)], assertion_timeout_s=0.5)
    assert [o.status for o in report.outcomes] == ["timeout"] + ["pass"] * 5
    assert report.reward == pytest.approx(5 / 6)


def test_printed_fake_results_do_not_change_the_score(sandbox):
    fake = (
        "import sys\n"
        "print('ALL TESTS PASSED')\n"
        "def below_zero(operations):\n"
        "    print('0000 {\"jobs\": [{\"results\": []}]}')\n"
        "    print('[\"case\", 0, 0, \"pass\", \"\"]', file=sys.stderr)\n"
        "    return False\n"
    )
    [report] = score_solutions(sandbox, [("HumanEval/3", fake)])
    assert (report.passed, report.total) == (3, 6)


def test_hostile_solutions_are_scored_as_failures_not_errors(sandbox, execs):
    header = "def below_zero(operations):\n"
    hostile = {
        # exiting from the candidate must not look like success
        "os_exit": "import os\n" + header + "    os._exit(0)\n",
        "sys_exit_at_import": "import sys\nsys.exit(0)\n" + header + "    return False\n",
        # killing the grader is the submission's doing: scored, not a RewardError. The
        # submissions after it in the same group are then graded again one per exec.
        "kill_grader": "import os, signal\n" + header + "    os.kill(os.getppid(), signal.SIGKILL)\n",
        # writing to the grader's stdout through /proc is refused (it is non-dumpable)
        "proc_fd": "import os\n" + header
        + "    fd = os.open(f'/proc/{os.getppid()}/fd/1', os.O_WRONLY)\n"
        + "    os.write(fd, b'forged\\n')\n    return True\n",
        # protocol messages without the per-process token are rejected
        "forged_report": "import os\n" + header
        + "    for fd in range(3, 16):\n"
        + "        try:\n            os.write(fd, b'[\"x\", \"pass\", 0]\\n')\n"
        + "        except OSError:\n            pass\n    return False\n",
        "memory_hog": header + "    blob = bytearray(8 * 1024 ** 3)\n    return True\n",
        "segfault": "import ctypes\n" + header + "    ctypes.string_at(0)\n",
    }
    reports = score_solutions(
        sandbox, [("HumanEval/3", code) for code in hostile.values()],
        assertion_timeout_s=2.0, memory_mb=512,
    )
    by_name = dict(zip(hostile, reports, strict=True))
    # One exec for the group, killed at the 3rd submission; the 3rd to 7th are then graded
    # again, one exec each.
    assert len(execs) == 1 + 5
    for name, report in by_name.items():
        assert report.reward == 0.0, (name, report)
    assert {o.status for o in by_name["os_exit"].outcomes} == {"crash"}
    assert by_name["sys_exit_at_import"].load_error == "SystemExit: 0"
    assert "PermissionError" in by_name["proc_fd"].outcomes[0].detail
    assert {o.status for o in by_name["forged_report"].outcomes} == {"error"}
    assert by_name["memory_hog"].outcomes[0].detail == "MemoryError"
    assert "SIGSEGV" in by_name["segfault"].outcomes[0].detail
    assert "killed" in (by_name["kill_grader"].load_error or by_name["kill_grader"].outcomes[0].detail)


# A setsid'd grandchild that SIGKILLs every later process its supervisor starts, for 10 s.
_KILLER = """
import os, time
_sup, _first = os.getppid(), os.getpid()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        end = time.time() + 10
        while time.time() < end:
            for p in os.listdir("/proc"):
                try:
                    if p.isdigit() and int(p) not in (os.getpid(), _first):
                        with open(f"/proc/{p}/stat") as f:
                            if int(f.read().rsplit(")", 1)[1].split()[1]) == _sup:
                                os.kill(int(p), 9)
                except Exception:
                    pass
        os._exit(0)
    os._exit(0)
os.wait()
def below_zero(operations):
    os._exit(1)
"""


def test_a_submission_cannot_turn_its_grade_into_a_harness_error(sandbox, execs):
    """A forged ``internal`` report at load time, a left-behind process that kills the
    restarted and the next test processes, and a reply that is slow to rebuild (10,000
    integers with colliding hashes): each is scored 0 as the submission's own failure, in
    one exec, and the honest submission graded after them scores 1."""
    header = "def below_zero(operations):\n"
    items = {
        "forged_internal": "import sys\nsys._getframe(1).f_locals['send']('internal', 'x')\n"
        + header + "    return False\n",
        "killer": _KILLER,
        "collide": "import sys\n" + header + "    f = sys._getframe(1)\n"
        "    f.f_locals['send']('result', f.f_locals['call_id'], {'s': [k * (2 ** 61 - 1) for k in range(10000)]})\n"
        "    return False\n",
        "honest": get_task("HumanEval/3").canonical_program,
    }
    reports = dict(zip(items, score_solutions(sandbox, [("HumanEval/3", c) for c in items.values()],
                                              assertion_timeout_s=0.5), strict=True))
    assert len(execs) == 1
    assert reports["forged_internal"].load_error == (
        "the test process broke the harness protocol while loading the solution")
    assert [o.status for o in reports["killer"].outcomes] == ["crash"] * 6
    # The submission's own failure either way: its case timed out on the rebuild (the unit test
    # test_a_forged_reply_that_is_slow_to_rebuild_is_the_cases_timeout pins that), or the
    # rebuild finished in time and the forged value failed the assertion.
    assert reports["collide"].outcomes[0].status in ("timeout", "fail")
    assert [r.reward for r in reports.values()] == [0.0, 0.0, 0.0, 1.0]


def test_judge_tampering_scores_0_and_is_counted_in_the_sandbox_and_the_episode(sandbox):
    header = "def below_zero(operations):\n"
    tampering = {
        "eq_always_true": "class Anything:\n    def __eq__(self, other):\n        return True\n"
        + header + "    return Anything()\n",
        "int_subclass": "class Yes(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n" + header + "    return Yes(0)\n",
        "os_exit_0": "import os\n" + header + "    os._exit(0)\n",
    }
    reports = score_solutions(sandbox, [("HumanEval/3", code) for code in tampering.values()],
                              assertion_timeout_s=2.0)
    for name, report in zip(tampering, reports, strict=True):
        assert (report.reward, report.judge_tamper) == (0.0, 6), (name, report.tamper)
    env = make_env(sandbox)
    env.reset(options={"task_id": "HumanEval/3"})
    obs, reward, terminated, _, info = env.step(answer(tampering["eq_always_true"]))
    assert (reward, terminated, info["judge_tamper"], info["tests_passed"]) == (0.0, True, 6, 0)
    assert "The judge refused 6 attempt(s)" in obs
    env.reset(options={"task_id": "HumanEval/3"})
    _, reward, _, _, info = env.step(answer(get_task("HumanEval/3").canonical_program))
    assert (reward, info["judge_tamper"]) == (1.0, 0)


def test_lingering_threads_and_escaped_processes_do_not_block_grading(sandbox):
    canonical_body = get_task("HumanEval/3").canonical_solution
    lingering = (
        "import os, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        + get_task("HumanEval/3").prompt + canonical_body
    )
    t0 = time.monotonic()
    [report] = score_solutions(sandbox, [("HumanEval/3", lingering)], assertion_timeout_s=2.0)
    assert report.reward == 1.0
    assert time.monotonic() - t0 < 10.0


def test_harness_failure_that_is_not_the_models_fault_raises_reward_error():
    # No python3 on the sandbox's PATH: the grader cannot start at all.
    with make_sandbox("bwrap", SandboxSpec(run_id="test-env-humaneval", env={"PATH": "/nonexistent"})) as sb:
        with pytest.raises(RewardError, match="stopped before running the solution"):
            score_solutions(sb, [("HumanEval/3", BELOW_ZERO_FALSE)])


def test_score_solutions_validates_its_arguments(sandbox):
    with pytest.raises(ConfigError, match="assertion_timeout_s=0"):
        score_solutions(sandbox, [("HumanEval/3", "")], assertion_timeout_s=0)
    with pytest.raises(ConfigError, match="task_id='HumanEval/-1'"):
        score_solutions(sandbox, [("HumanEval/-1", "")])


# -- episodes -----------------------------------------------------------------------------


def make_env(sandbox, **kwargs) -> gymnasium.Env:
    return gymnasium.make("agentrl/HumanEval-v0", sandbox=sandbox, **kwargs)


def test_full_episode_tool_call_then_submission(sandbox, execs):
    env = make_env(sandbox, split="all")
    obs, info = env.reset(seed=0, options={"task_id": "HumanEval/3"})
    assert "def below_zero(operations: List[int]) -> bool:" in obs
    assert info["task_id"] == "HumanEval/3" and info["anchor"] == ("HumanEval/3", 0)
    assert info["observation_role"] == "user"
    assert [t["function"]["name"] for t in info["tools"]] == ["python"]
    assert "<tool_call>" in info["system_prompt"] and "```python" in info["system_prompt"]

    code = "print(sum([1, 2, -4]))\nimport sys\nprint('oops', file=sys.stderr)"
    obs, reward, terminated, truncated, info = env.step("Let me try it.\n" + tool(code))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["observation_role"] == "tool" and not info["invalid_action"]
    assert info["tool_calls"] == [ToolCall("python", {"code": code})]
    assert "Exit code: 0\nstdout:\n-1\nstderr:\noops" in obs
    assert info["anchor"] == ("HumanEval/3", 1)
    assert execs[-1].stdout == "-1\n"  # the sandbox's listener saw the real exec

    canonical = get_task("HumanEval/3").canonical_program
    obs, reward, terminated, truncated, info = env.step(answer(canonical))
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert (info["tests_passed"], info["tests_total"]) == (6, 6)
    assert obs.startswith("Submission graded: 6 of 6 tests passed.")
    with pytest.raises(EnvError, match="ended; call reset"):
        env.step(answer(canonical))
    env.close()


def test_two_tool_calls_in_one_turn_and_files_persist_within_the_episode(sandbox, execs):
    env = make_env(sandbox, split="all")
    env.reset(options={"task_id": "HumanEval/3"})
    assert execs == []  # a first reset runs nothing in the sandbox
    obs, _, _, _, info = env.step(
        tool("open('notes.txt', 'w').write('kept')") + "\n" + tool("print(open('notes.txt').read())")
    )
    assert len(info["tool_calls"]) == 2 and len(info["tool_outputs"]) == 2
    assert "Result of tool call 2 of 2 (python):\nExit code: 0\nstdout:\nkept" in obs
    # the tool messages a full-history prompt shows are the observation, calls left included
    assert obs == "\n\n".join(info["tool_outputs"]) and info["tool_outputs"][-1].endswith("\n\n(Tool calls left: 6.)")
    # The next episode starts with an empty working directory (one cleaning exec).
    env.reset(options={"task_id": "HumanEval/3"})
    assert len(execs) == 3 and execs[-1].command[0] == "find"
    obs, *_ = env.step(tool("import os\nprint(sorted(os.listdir('.')))"))
    assert "stdout:\n[]" in obs


def test_tool_timeout_is_reported(sandbox):
    env = make_env(sandbox, split="all", tool_timeout_s=1.0)
    env.reset(options={"task_id": "HumanEval/3"})
    t0 = time.monotonic()
    obs, reward, terminated, truncated, _ = env.step(tool("while True:\n    pass"))
    assert time.monotonic() - t0 < 5.0
    assert "Timed out after 1 s; the program was killed." in obs
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_C09_tool_output_invalid_bytes_and_huge_output_reach_the_model_bounded(sandbox):
    env = make_env(sandbox, split="all", tool_output_limit_chars=1000)
    env.reset(options={"task_id": "HumanEval/3"})
    obs, _, terminated, _, _ = env.step(
        tool("import sys\nsys.stdout.buffer.write(b'ok\\xff\\xfe')\nsys.exit(3)")
    )
    assert "Exit code: 3\nstdout:\nok\ufffd\ufffd" in obs and not terminated
    obs, _, terminated, _, _ = env.step(tool("print('x' * 5_000_000)"))
    assert not terminated
    assert "characters dropped ...]" in obs and len(obs) < 2000
    assert "bytes of output were dropped by the sandbox" in obs


def test_invalid_action_then_recovery(sandbox):
    env = make_env(sandbox, split="all")
    env.reset(options={"task_id": "HumanEval/3"})
    obs, reward, terminated, truncated, info = env.step("I think the answer is to sum the list.")
    assert info["invalid_action"] and info["observation_role"] == "user"
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "neither a tool call nor a final answer" in obs and "```python" in obs
    assert info["anchor"] == ("HumanEval/3", 0)

    # A malformed tool call: invalid, not executed, the message names the problem.
    malformed = '<tool_call>{"name": "python", "arguments": {}}</tool_call>'
    obs, reward, terminated, truncated, info = env.step(malformed)
    assert info["invalid_action"] and not terminated and not truncated
    assert "'code' is a required property" in obs
    obs, _, _, _, info = env.step(tool("print(1)").replace('"python"', '"bash"'))
    assert info["invalid_action"] and "unknown tool 'bash'" in obs
    assert info["num_invalid_actions"] == 3 and info["num_tool_calls"] == 0

    obs, reward, terminated, truncated, info = env.step(answer(get_task("HumanEval/3").canonical_program))
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert not info["invalid_action"]


def test_too_many_invalid_actions_truncate(sandbox):
    env = make_env(sandbox, split="all", max_invalid_actions=1)
    env.reset(options={"task_id": "HumanEval/3"})
    assert env.step("no")[3] is False
    obs, reward, terminated, truncated, _ = env.step("still no")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert "the task is over" in obs


def test_tool_call_limit_truncates_and_extra_calls_do_not_run(sandbox, execs):
    env = make_env(sandbox, split="all", max_tool_calls=2)
    env.reset(options={"task_id": "HumanEval/3"})
    _, _, _, truncated, info = env.step(tool("print(1)"))
    assert not truncated and info["num_tool_calls"] == 1
    n_before = len(execs)
    obs, reward, terminated, truncated, info = env.step(tool("print(2)") + tool("print(3)"))
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert len(execs) == n_before + 1  # only the call within the budget ran
    assert "Tool call limit reached: 1 call(s) not run" in obs
    with pytest.raises(EnvError):
        env.step(tool("print(4)"))


def test_wrong_submission_and_solution_that_does_not_load(sandbox):
    env = make_env(sandbox, split="all")
    env.reset(options={"task_id": "HumanEval/3"})
    obs, reward, terminated, _, info = env.step(answer(BELOW_ZERO_FALSE))
    assert (reward, terminated) == (0.5, True)
    assert info["test_results"] == ["pass", "pass", "fail", "pass", "fail", "fail"]
    env.reset(options={"task_id": "HumanEval/3"})
    obs, reward, terminated, _, info = env.step(answer("def below_zero(operations):\n    return (\n"))
    assert (reward, terminated) == (0.0, True)
    assert info["load_error"].startswith("SyntaxError")
    assert "could not be loaded: SyntaxError" in obs


def test_visible_tests_pay_the_training_reward_and_the_judge_grades_the_hidden_check(sandbox):
    """A submission fitted to HumanEval/0's two docstring examples: the training reward
    (reward_tests="visible") is 1, the judge (HumanEvalEnv.judge_kwargs: the hidden check,
    7 cases) scores it below 1. Both graded by the same sandboxed harness."""
    fitted = ("def has_close_elements(numbers, threshold):\n"
              "    return numbers == [1.0, 2.8, 3.0, 4.0, 5.0, 2.0]\n")
    scores = {}
    for name, kwargs in (("train", {"reward_tests": "visible"}), ("judge", dict(HumanEvalEnv.judge_kwargs))):
        env = make_env(sandbox, split="all", **kwargs)
        obs, _ = env.reset(options={"task_id": "HumanEval/0"})
        _, reward, terminated, _, info = env.step(answer(fitted))
        assert terminated and info["reward_tests"] == kwargs["reward_tests"]
        scores[name] = (reward, info["tests_passed"], info["tests_total"])
        env.close()
    assert scores["train"] == (1.0, 2, 2)
    reward, passed, total = scores["judge"]
    assert total == 7 and 0 < passed < 7 and reward == pytest.approx(passed / 7)
    # a problem without a docstring example (HumanEval/41) trains on its first hidden case
    items = [("HumanEval/41", "def car_race_collision(n):\n    return 4\n")]
    visible, hidden = (score_solutions(sandbox, items, tests=t)[0] for t in ("visible", "hidden"))
    assert (visible.passed, visible.total, hidden.passed, hidden.total) == (1, 1, 1, 5)  # candidate(2) == 4


def test_reset_is_deterministic_and_stays_in_its_split(sandbox):
    env_a = make_env(sandbox, split="train", clean_workdir_on_reset=False)
    env_b = make_env(sandbox, split="train", clean_workdir_on_reset=False)
    first = [env_a.reset(seed=s)[1]["task_id"] for s in range(20)]
    second = [env_b.reset(seed=s)[1]["task_id"] for s in range(20)]
    assert first == second
    assert len(set(first)) > 10
    assert set(first) <= set(task_ids("train"))
    test_env = make_env(sandbox, split="test", clean_workdir_on_reset=False)
    assert {test_env.reset(seed=s)[1]["task_id"] for s in range(20)} <= set(task_ids("test"))
    # An explicit task id is served whatever the split (the task source owns the split).
    assert env_a.reset(options={"task_id": "HumanEval/0"})[1]["split"] == "test"
    with pytest.raises(ConfigError, match=r"task_id='HumanEval/164' is not a HumanEval task"):
        env_a.reset(options={"task_id": "HumanEval/164"})
    with pytest.raises(ConfigError, match=r"unknown reset options \['difficulty'\]"):
        env_a.reset(options={"difficulty": 3})


def test_lifecycle_errors_and_close_leaves_the_sandbox_open(sandbox):
    env = HumanEvalEnv(sandbox, split="all")
    with pytest.raises(EnvError, match="before reset"):
        env.step("x")
    env.reset(options={"task_id": "HumanEval/3"})
    with pytest.raises(EnvError, match="must be the completion text"):
        env.step(["not", "text"])  # type: ignore[arg-type]
    env.close()
    with pytest.raises(EnvError, match="after close"):
        env.step("x")
    with pytest.raises(EnvError, match="after close"):
        env.reset()
    assert sandbox.exec(["python3", "-c", "print('still open')"]).stdout == "still open\n"


def test_without_tools_the_prompt_and_schemas_say_so(sandbox):
    env = make_env(sandbox, split="all", max_tool_calls=0)
    _, info = env.reset(options={"task_id": "HumanEval/3"})
    assert info["tools"] == [] and "You have no tools." in info["system_prompt"]
    obs, reward, terminated, truncated, _ = env.step(tool("print(1)"))
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert "1 call(s) not run" in obs


def test_constructor_validation(sandbox):
    with pytest.raises(ConfigError, match="does not implement sandboxes.base.Sandbox"):
        HumanEvalEnv(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="split='dev'"):
        HumanEvalEnv(sandbox, split="dev")
    with pytest.raises(ConfigError, match="max_tool_calls=-1"):
        HumanEvalEnv(sandbox, max_tool_calls=-1)
    with pytest.raises(ConfigError, match="tool_timeout_s=0"):
        HumanEvalEnv(sandbox, tool_timeout_s=0)
    with pytest.raises(ConfigError, match=r"reward_tests='all' must be one of \('hidden', 'visible'\)"):
        HumanEvalEnv(sandbox, reward_tests="all")


def test_sandbox_failure_propagates_as_sandbox_error():
    sb = make_sandbox("bwrap", SandboxSpec(run_id="test-env-humaneval"))
    env = HumanEvalEnv(sb, split="all")
    env.reset(options={"task_id": "HumanEval/3"})
    sb.close()  # the sandbox dies mid-episode
    with pytest.raises(SandboxError):
        env.step(tool("print(1)"))
    env2 = HumanEvalEnv(sb, split="all", clean_workdir_on_reset=False)
    env2.reset(options={"task_id": "HumanEval/3"})
    with pytest.raises(SandboxError):  # grading never turns it into a reward of 0
        env2.step(answer(BELOW_ZERO_FALSE))


def test_registered_and_passes_gymnasium_env_checker(sandbox):
    assert "agentrl/HumanEval-v0" in gymnasium.registry
    env = make_env(sandbox, split="test")
    assert isinstance(env.unwrapped, HumanEvalEnv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the passive checker warns on contract breaches
        # The close check re-makes the env from env.spec; the copy shares the sandbox
        # (environments.core.SandboxSharingKwargs) and closing it leaves the sandbox open.
        check_env(env.unwrapped)
        obs, info = env.reset(seed=1)
        env.step("not an action")
    assert not sandbox.closed
    assert len(load_tasks()) == 164
