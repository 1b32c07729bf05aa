"""Benchmark: what SmolLM2-135M-Instruct does at each stage of an ``agentrl/ShellLookup-v1``
episode, from hand-built correct histories, under the env's own prompts.

Run on demand (pytest does not collect this file)::

    .venv/bin/python tests/benchmarks/bench_lookup_stages.py              # 4 tasks x 8 samples per cell
    .venv/bin/python tests/benchmarks/bench_lookup_stages.py --tasks 2 --samples 4   # quick check

The numbers behind ShellLookup's design (``environments/shell_lookup.py``: the read command
named in every task, the worked example as chat turns, families whose file names a directory).
For every family and the first ``--tasks`` train tasks of it, three stages are sampled
``--samples`` times each with raw vLLM (``LLM.generate``, the rollout's temperature, stop
string and ``max_new_tokens``; no sandbox: each history is what a correct episode would hold):

1. ``read``: the first reply; right when it calls ``cat <the file the task names>``.
2. ``act``: after that call and the file's content as its tool result; right when the reply
   calls the family's reference command (``task.solution``).
3. ``done``: after the reference command and its empty result; right when the reply has no
   tool call (the agent says it is done, so the checks run).

Each stage is measured under two layouts of the same worked example: ``turns`` (the env's
``example_messages``, what the rollout sends) and ``inline`` (the same example written into
the system prompt as text, as ShellLookup did before 3 December 2026). Prints one table:
rights out of samples per family, stage and layout, and the product of the three stages (an
estimate of a full episode's success, ignoring retries). The tool results are rendered by the
env's own code (``_tool_messages``, ``_format``), so they read exactly as in an episode.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STAGES = ("read", "act", "done")
LAYOUTS = ("turns", "inline")


class _Spec:
    workdir = "/work"


class _Sandbox:
    spec = _Spec()


def _env():
    from environments.shell_lookup import ShellLookupEnv

    env = ShellLookupEnv.__new__(ShellLookupEnv)  # its prompts only: no sandbox is started
    env.max_tool_calls, env.tool_output_limit_chars, env.tool_timeout_s, env.sandbox = 4, 2000, 10.0, _Sandbox()
    return env


def _inline(examples: tuple[dict[str, str], ...]) -> str:
    names = {"user": "Task", "assistant": "Assistant", "tool": "Tool"}
    return "Example (another task):\n" + "\n".join(f"{names[m['role']]}: {m['content']}" for m in examples)


def _act_check(task, path: str):
    """Right acts: the reference command, or its plain equivalent (``mkdir -p NAME``;
    ``echo VALUE > answer.txt`` for the value family)."""
    sol = task.solution.strip()
    if sol.startswith("mkdir "):
        pattern = r'"command": "mkdir (-p )?' + re.escape(sol.split(" ", 1)[1]) + '"'
    else:
        key = re.search(r"the value of `(\w+)`", task.prompt).group(1)
        value = next(line.split("=", 1)[1] for line in task.files[path].splitlines() if line.startswith(f"{key}="))
        pattern = r'"command": "echo \'?' + re.escape(value) + r"'? > answer.txt\""
    return lambda t: re.search(pattern, t) is not None or f'"command": "{sol}"' in t


def cases(tasks_per_family: int):
    """``(family, stage, layout, messages, is_right)`` for every cell."""
    from environments.shell_lookup import FAMILIES, LOOKUP, _call, lookup_task

    env = _env()
    examples = env.example_messages()
    out = []
    for fam in range(len(FAMILIES)):
        for j in range(tasks_per_family):
            task = lookup_task(LOOKUP.task_ids("train")[fam + len(FAMILIES) * j])
            (path,) = [p for p in task.files if p != "data.txt"]
            read, solution = f"cat {path}", task.solution.strip()
            history = [{"role": "user", "content": env._task_message(task.prompt)}]
            after_read = history + [{"role": "assistant", "content": _call(read)},
                                    {"role": "tool", "content": env.tool_result(task.files[path], 1)}]
            after_act = after_read + [{"role": "assistant", "content": _call(solution)},
                                      {"role": "tool", "content": env.tool_result("", 2)}]
            checks = {
                "read": (history, lambda t, read=read: f'"command": "{read}"' in t),
                "act": (after_read, _act_check(task, path)),
                "done": (after_act, lambda t: "<tool_call>" not in t),
            }
            for stage, (msgs, right) in checks.items():
                for layout in LAYOUTS:
                    if layout == "turns":
                        full = [{"role": "system", "content": env.system_prompt}, *examples, *msgs]
                    else:
                        full = [{"role": "system", "content": env.system_prompt + "\n\n" + _inline(examples)}, *msgs]
                    out.append((task.category, stage, layout, full, right))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=4, help="train tasks per family")
    p.add_argument("--samples", type=int, default=8, help="samples per history")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from agentrl.config import load_default_config
    from agentrl.model_zoo import prepare_model

    cfg = load_default_config()
    path = str(prepare_model(cfg.model.path))
    tok = AutoTokenizer.from_pretrained(path)
    cells = cases(a.tasks)
    prompts = []
    for _, _, _, msgs, _ in cells:
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        prompts.append({"prompt_token_ids": list(ids["input_ids"] if hasattr(ids, "keys") else ids)})
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=cfg.rollout.max_context_tokens,
              seed=a.seed, kv_cache_memory_bytes=2**29)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(n=a.samples, temperature=cfg.rollout.temperature,
                                                max_tokens=cfg.rollout.max_new_tokens,
                                                stop=list(cfg.rollout.stop_strings), include_stop_str_in_output=True))
    dt = time.perf_counter() - t0
    tally: dict[tuple[str, str, str], list[int]] = {}
    for (fam, stage, layout, _, right), o in zip(cells, outs):
        t = tally.setdefault((fam, stage, layout), [0, 0])
        t[0] += sum(bool(right(x.text)) for x in o.outputs)
        t[1] += len(o.outputs)
    fams = list(dict.fromkeys(c[0] for c in cells))
    print(f"SmolLM2-135M-Instruct, temperature {cfg.rollout.temperature}, {a.tasks} tasks x {a.samples} samples "
          f"per cell, {len(prompts) * a.samples} samples in {dt:.0f} s; load {os.getloadavg()[0]:.1f}")
    print(f"{'family':10s} {'layout':7s} " + " ".join(f"{s:>9s}" for s in STAGES) + "   product")
    for fam in fams:
        for layout in LAYOUTS:
            cols = [tally[(fam, s, layout)] for s in STAGES]
            prod = 1.0
            for r, n in cols:
                prod *= r / n
            print(f"{fam:10s} {layout:7s} " + " ".join(f"{r:4d}/{n:<4d}" for r, n in cols) + f"   {prod:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
