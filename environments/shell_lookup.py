"""``agentrl/ShellLookup-v0``: small look-up jobs with a ``bash`` tool in a sandbox, whose
answer is only in the sandbox's files, so the agent must run a command, read its output and
act on it. Made for small models: a 135M instruct model solves some of them some of the
time, which is what RL needs (a non-zero pass rate, reward variance within groups).

Tasks
    Procedurally generated from a seed: ids ``lookup/<seed>``, train seeds 0-999, test
    seeds 1000-1047 (disjoint, so the test split is held out). The seed picks the family
    (``seed % 6``) and, with ``random.Random(seed)``, the file names, contents and the asked
    value, so an answer cannot be memorised from another seed. Families (``FAMILIES``):

    - ``value``: ``settings.ini`` holds 4-5 ``key=value`` lines; write the value of one key
      to ``answer.txt``.
    - ``note``: ``note.txt`` asks for a directory of a given name; create it.
    - ``count``: write the number of lines of ``items.txt`` to ``answer.txt``.
    - ``find``: exactly one of 3-4 files in ``docs/`` contains a word; write that file's
      name to ``answer.txt``.
    - ``first_line``: write the first line of ``list.txt`` to ``answer.txt``.
    - ``rename``: ``note.txt`` names the new name of ``data.txt``; rename it (content kept).

Protocol, reward, anchor: as ``agentrl/ShellTasks-v0`` (``environments.shell_tasks``), whose
env this subclasses: tool calls run as ``bash -c`` in the working directory, a reply without
a tool call ends the episode and the checks run in the sandbox (the reward is the fraction of
checks met; every check is exact: ``answer.txt`` must hold exactly the answer, trailing
newlines aside). The system prompt adds a one-shot demonstration (read a file, write what it
says, say done) on a task of another kind than the families (Brown et al. 2020, "Language
Models are Few-Shot Learners", one-shot prompting): without it SmolLM2-135M-Instruct made a
valid first tool call in 2 of 48 samples, with it (temperature 0.3) in 19 of 48.
"""

from __future__ import annotations

import random
import shlex
from typing import Callable

from environments.seeded import SeededTasks
from environments.shell_task_bank import ShellTask, _t, same
from environments.shell_tasks import ShellTasksEnv

__all__ = ["ENV_ID", "FAMILIES", "LOOKUP", "ShellLookupEnv", "lookup_task"]

ENV_ID = "agentrl/ShellLookup-v0"
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


def _value(rng: random.Random) -> tuple[str, str, list[tuple[str, str]], str, dict[str, str]]:
    values = _values(rng)
    key = rng.choice(list(values))
    ini = "".join(f"{k}={v}\n" for k, v in values.items())
    return (f"What is the value of `{key}` in `settings.ini`? Write just the value to `answer.txt`.",
            "value", [(f"answer.txt holds the value of {key}", same("answer.txt", values[key]))],
            f"grep '^{key}=' settings.ini | cut -d= -f2 > answer.txt", {"settings.ini": ini})


def _note(rng: random.Random) -> tuple[str, str, list[tuple[str, str]], str, dict[str, str]]:
    name = f"{_word(rng)}_{rng.randint(10, 99)}"
    return ("Read `note.txt` and do what it asks.", "note",
            [("the directory the note asks for exists", f"test -d {shlex.quote(name)}")],
            f"mkdir {shlex.quote(name)}", {"note.txt": f"Please create a directory named {name} here.\n"})


def _count(rng: random.Random) -> tuple[str, str, list[tuple[str, str]], str, dict[str, str]]:
    n = rng.randint(3, 9)
    lines = "".join(f"{_word(rng)}\n" for _ in range(n))
    return ("How many lines does `items.txt` have? Write just the number to `answer.txt`.", "count",
            [("answer.txt holds the line count of items.txt", same("answer.txt", str(n)))],
            "wc -l < items.txt > answer.txt", {"items.txt": lines})


def _find(rng: random.Random) -> tuple[str, str, list[tuple[str, str]], str, dict[str, str]]:
    words = rng.sample(_WORDS, 8)
    key, others = words[0], words[1:]
    names = rng.sample(["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"], rng.randint(3, 4))
    hit = rng.choice(names)
    files = {}
    for i, name in enumerate(names):
        body = [others[(2 * i) % len(others)], others[(2 * i + 1) % len(others)]]
        if name == hit:
            body.insert(rng.randint(0, 2), key)
        files[f"docs/{name}"] = " ".join(body) + "\n"
    return (f"Exactly one file in `docs/` contains the word `{key}`. Write that file's name (without `docs/`) "
            "to `answer.txt`.", "find", [(f"answer.txt names the file with {key}", same("answer.txt", hit))],
            f"grep -l -w {key} docs/* | xargs -n1 basename > answer.txt", files)


def _first_line(rng: random.Random) -> tuple[str, str, list[tuple[str, str]], str, dict[str, str]]:
    lines = [f"{_word(rng)} {rng.randint(1, 99)}" for _ in range(rng.randint(3, 6))]
    return ("Write the first line of `list.txt` to `answer.txt`.", "first_line",
            [("answer.txt holds the first line of list.txt", same("answer.txt", lines[0]))],
            "head -n 1 list.txt > answer.txt", {"list.txt": "".join(f"{x}\n" for x in lines)})


def _rename(rng: random.Random) -> tuple[str, str, list[tuple[str, str]], str, dict[str, str]]:
    new = f"{_word(rng)}{rng.randint(10, 99)}.txt"
    body = f"{_word(rng)} {_word(rng)} {rng.randint(100, 999)}\n"
    return ("`note.txt` says what `data.txt` must be renamed to. Rename it.", "rename",
            [("data.txt renamed as the note says, content kept",
              f"! test -e data.txt && {same(new, body)}")],
            f"mv data.txt {shlex.quote(new)}", {"note.txt": f"Rename data.txt to {new}\n", "data.txt": body})


FAMILIES: tuple[Callable[[random.Random], tuple], ...] = (_value, _note, _count, _find, _first_line, _rename)
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


_DEMO = (
    "Example (another task):\n"
    "Task: `owner.txt` names a user. Write that name to `name.txt`.\n"
    "Assistant: <tool_call>\n"
    '{"name": "bash", "arguments": {"command": "cat owner.txt"}}\n'
    "</tool_call>\n"
    "Tool: Exit code: 0\n"
    "stdout:\n"
    "The owner is maple7.\n"
    "Assistant: <tool_call>\n"
    '{"name": "bash", "arguments": {"command": "echo maple7 > name.txt"}}\n'
    "</tool_call>\n"
    "Tool: Exit code: 0\n"
    "Assistant: Done: name.txt holds maple7."
)


class ShellLookupEnv(ShellTasksEnv):
    """``agentrl/ShellLookup-v0`` (module docstring). Arguments as ``ShellTasksEnv``'s; the
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
            "are then checked.\n\n" + _DEMO
        )
