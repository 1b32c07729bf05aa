"""``agentrl/ShellLookup-v1``: small look-up jobs with a ``bash`` tool in a sandbox, whose
answer is only in the sandbox's files, so the agent must run a command, read its output and
act on it. Made for small models: a 135M instruct model solves some of them some of the
time, which is what RL needs (a non-zero pass rate, reward variance within groups).

Tasks
    Procedurally generated from a seed: ids ``lookup/<seed>``, train seeds 0-999, test
    seeds 1000-1047 (disjoint, so the test split is held out). The seed picks the family
    (``seed % 6``) and, with ``random.Random(seed)``, the file names, contents and the asked
    value, so an answer cannot be memorised from another seed. Each task names the file to read and the command that reads it (``Read `note.txt` with
    `cat note.txt`, then ...``); what to do next is only in that file. Families (``FAMILIES``):

    - ``note``: ``note.txt`` asks for a directory of a given name ("Please create a directory
      named X here."); create it.
    - ``todo``: ``todo.txt`` holds one command (``mkdir X``); run it.
    - ``request``: ``request.txt`` asks for a folder ("Make a new folder called X.").
    - ``memo``: ``memo.txt`` says "Create a directory named X."
    - ``readme``: ``readme.txt`` says "Please make a directory called X here."
    - ``value``: ``settings.ini`` holds 4-5 ``key=value`` lines; write the value of one key
      to ``answer.txt`` (the hard family: the output must be transformed into a command).

    Measured with SmolLM2-135M-Instruct (temperature 0.3, 128-token turns, the first 24 train
    tasks x 4 samples, real sandboxes): success 0.69 (note), 0.19 (todo), 0.12 (request), 0.31
    (memo) and 0.00 (value); most failures say done before acting, or repeat a call.
    ``tests/benchmarks/bench_lookup_stages.py`` measures each stage (read, act, say done) per
    family from correct histories, with the example as turns and written inline.

Versions: v1 is the task set above. v0 is retired (``environments.registry.RETIRED_ENV_IDS``;
making it raises ``ConfigError`` naming v1): its task families, its prompt and the shared
ShellTasks protocol differ from what this code builds, so it cannot be restored exactly.

Protocol, reward, anchor: as ``agentrl/ShellTasks-v0`` (``environments.shell_tasks``), whose
env this subclasses: tool calls run as ``bash -c`` in the working directory, a reply without
a tool call ends the episode and the checks run in the sandbox (the reward is the fraction of
checks met; every check is exact: a directory of exactly that name, ``answer.txt`` holding
exactly the answer, trailing newlines aside). Before the task the model sees one worked
example as chat turns (``example_turns``; few-shot prompting, Brown et al. 2020, "Language
Models are Few-Shot Learners", Sec. 2): read ``steps.txt``, run the command it holds, say
done.
"""

from __future__ import annotations

import random
import shlex
from typing import Callable

from agentrl.types import ExecResult
from environments.seeded import SeededTasks
from environments.shell_task_bank import ShellTask, _t, same
from environments.shell_tasks import ShellTasksEnv

__all__ = ["ENV_ID", "FAMILIES", "LOOKUP", "ShellLookupEnv", "example_turns", "lookup_task"]

ENV_ID = "agentrl/ShellLookup-v1"
LOOKUP = SeededTasks("lookup", "ShellLookup", train=range(0, 1000), test=range(1000, 1048))

_WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "amber", "cedar", "delta", "ember",
          "frost", "grape", "harbor", "iris", "jade", "koala", "lemon", "mango", "nova", "olive", "pearl",
          "quartz", "raven", "salt", "tulip", "umber", "violet", "willow", "yarrow", "zebra", "birch")
_KEYS = ("port", "user", "host", "level", "color", "mode", "timeout", "region", "theme", "owner")


def _word(rng: random.Random) -> str:
    return rng.choice(_WORDS)


def _values(rng: random.Random) -> dict[str, str]:
    keys = rng.sample(_KEYS, rng.randint(4, 5))
    return {k: (str(rng.randint(1000, 9999)) if k in ("port", "timeout") else f"{_word(rng)}{rng.randint(1, 99)}")
            for k in keys}


def _read(path: str) -> str:
    """The start of every task: which file to read, and the command that reads it (a 135M
    model finds the first call far more often when the task names it: 109-128 of 128 samples
    against 0-3, measured at temperature 0.3)."""
    return f"Read `{path}` with `cat {path}`, then"


def _directory(path: str, category: str, instruction: str, check: str, text: str) -> Callable[[random.Random], tuple]:
    """A family whose file asks for a directory: ``text`` (with ``{name}``) is the file's content,
    ``instruction`` ends the task's sentence, ``check`` describes the exact check."""
    def make(rng: random.Random) -> tuple[str, str, list[tuple[str, str]], str, dict[str, str]]:
        name = f"{_word(rng)}_{rng.randint(10, 99)}"
        return (f"{_read(path)} {instruction}", category, [(check, f"test -d {shlex.quote(name)}")],
                f"mkdir {shlex.quote(name)}", {path: text.format(name=name)})
    make.__name__ = make.__qualname__ = f"_{category}"
    return make


_note = _directory("note.txt", "note", "do what it says.", "the directory the note asks for exists",
                   "Please create a directory named {name} here.\n")
_todo = _directory("todo.txt", "todo", "run the command it holds.", "the directory todo.txt's command makes exists",
                   "mkdir {name}\n")
_request = _directory("request.txt", "request", "do what it asks.", "the folder the request names exists",
                      "Make a new folder called {name}.\n")
_memo = _directory("memo.txt", "memo", "do what it asks.", "the directory the memo asks for exists",
                   "Create a directory named {name}.\n")
_readme = _directory("readme.txt", "readme", "do what it says.", "the directory the readme asks for exists",
                     "Please make a directory called {name} here.\n")


def _value(rng: random.Random) -> tuple[str, str, list[tuple[str, str]], str, dict[str, str]]:
    values = _values(rng)
    key = rng.choice(list(values))
    ini = "".join(f"{k}={v}\n" for k, v in values.items())
    return (f"{_read('settings.ini')} write just the value of `{key}` to `answer.txt`.",
            "value", [(f"answer.txt holds the value of {key}", same("answer.txt", values[key]))],
            f"grep '^{key}=' settings.ini | cut -d= -f2 > answer.txt", {"settings.ini": ini})


FAMILIES: tuple[Callable[[random.Random], tuple], ...] = (_note, _todo, _request, _memo, _readme, _value)
"""The task makers, indexed by ``seed % len(FAMILIES)``."""


def lookup_task(task_id: str) -> ShellTask:
    """The task ``lookup/<seed>`` (module docstring); the same id always gives the same task.

    Raises:
        ConfigError: ``task_id`` is not ``lookup/<seed>`` with a decimal seed.
    """
    seed = LOOKUP.seed_of(task_id)
    rng = random.Random(seed)
    prompt, category, checks, solution, files = FAMILIES[seed % len(FAMILIES)](rng)
    task = _t(str(seed), category, prompt, checks, solution, files)
    return ShellTask(task_id=task_id, category=task.category, prompt=task.prompt, checks=task.checks,
                     solution=task.solution, files=task.files)


def _call(command: str) -> str:
    return '<tool_call>\n{"name": "bash", "arguments": {"command": "%s"}}\n</tool_call>' % command


def example_turns(task_message: Callable[[str], str], tool_result: Callable[[str, int], str]) -> tuple[dict[str, str], ...]:
    # tool_result(stdout, calls_made) renders one command's result as the env would
    """The worked example shown before every task, as chat turns (``StepInfo.example_messages``):
    a job of the same shape as the families but on another file and command (read
    ``steps.txt``, run ``touch ready.txt`` which it holds, say done), rendered with the env's own
    task message and tool-result format so it reads exactly like an episode.

    Why chat turns (measured on SmolLM2-135M-Instruct, temperature 0.3, 128 samples per cell,
    from hand-built correct histories): with the example inside the system prompt the model
    never replied without a tool call after acting (0 of 128: it kept calling tools until the
    limit); as chat turns it did in 125 of 128, and it still ran the command a note asks for
    (a directory: 79 of 128; a `mkdir` line: 41 of 128). An example of a *different* job as chat
    turns (write a name to a file) made it copy the example's second call instead (1-26 of
    128)."""
    return (
        {"role": "user", "content": task_message("Read `steps.txt` with `cat steps.txt`, then run the command it holds.")},
        {"role": "assistant", "content": _call("cat steps.txt")},
        {"role": "tool", "content": tool_result("touch ready.txt", 1)},
        {"role": "assistant", "content": _call("touch ready.txt")},
        {"role": "tool", "content": tool_result("", 2)},
        {"role": "assistant", "content": "Done: I ran touch ready.txt."},
    )


class ShellLookupEnv(ShellTasksEnv):
    """``agentrl/ShellLookup-v1`` (module docstring). Arguments as ``ShellTasksEnv``'s; the
    default ``max_tool_calls`` is 4 (these jobs take one to three commands).

    Raises:
        ConfigError: an argument is out of range or ``sandbox`` lacks the interface.
    """

    def __init__(self, sandbox, split: str = "train", max_tool_calls: int = 4, tool_timeout_s: float = 10.0,
                 max_invalid_actions: int = 2, tool_output_limit_chars: int = 2000) -> None:
        super().__init__(sandbox, split=split, max_tool_calls=max_tool_calls, tool_timeout_s=tool_timeout_s,
                         max_invalid_actions=max_invalid_actions, tool_output_limit_chars=tool_output_limit_chars)

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        return LOOKUP.task_ids(split)

    @classmethod
    def get_task(cls, task_id: str) -> ShellTask:
        return lookup_task(task_id)

    @classmethod
    def split_of(cls, task_id: str) -> str:
        return LOOKUP.split_of(task_id) or "none"

    @property
    def system_prompt(self) -> str:
        return (
            "You work in a Linux sandbox with no network. You have one tool, `bash`: it runs a "
            "command in the task's working directory and shows you its exit code, stdout and "
            f"stderr ({self.max_tool_calls} calls per task). The answer is in the files: read "
            "them with a command first, then act on what the output says. Call the tool exactly "
            "like this, one call per reply and nothing after it:\n"
            "<tool_call>\n"
            '{"name": "bash", "arguments": {"command": "cat note.txt"}}\n'
            "</tool_call>\n"
            "When the task is done, reply with one short sentence and no tool call: the files "
            "are then checked."
        )

    def example_messages(self) -> tuple[dict[str, str], ...]:
        return example_turns(self._task_message, self.tool_result)

    def tool_result(self, stdout: str, calls_made: int) -> str:
        """The tool message an episode shows after its ``calls_made``-th command exited 0 with
        ``stdout`` (for worked examples and hand-built histories)."""
        res = ExecResult(command=("bash", "-c", ""), exit_code=0, stdout=stdout and stdout.rstrip("\n") + "\n",
                         stderr="", duration_s=0.0)
        return self._tool_messages(["Result (bash):\n" + self._format(res)], max(self.max_tool_calls - calls_made, 0))[0]
