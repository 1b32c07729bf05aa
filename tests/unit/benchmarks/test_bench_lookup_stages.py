"""The ShellLookup stage benchmark's cells (``tests/benchmarks/bench_lookup_stages.py``):
every family gets the three stages under both layouts, the histories are what a correct
episode holds (the env's own tool messages), and each stage's check accepts the right reply
and rejects the wrong ones. No engine: ``cases`` is pure."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from environments.shell_lookup import FAMILIES, _call

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_lookup_stages.py"
_spec = importlib.util.spec_from_file_location("bench_lookup_stages", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_every_family_gets_each_stage_in_both_layouts():
    cells = bench.cases(1)
    assert len(cells) == len(FAMILIES) * len(bench.STAGES) * len(bench.LAYOUTS)
    assert {(c[1], c[2]) for c in cells} == {(s, lay) for s in bench.STAGES for lay in bench.LAYOUTS}
    for fam, stage, layout, msgs, _ in cells:
        assert msgs[0]["role"] == "system"
        if layout == "inline":  # the example is text in the system prompt, not turns
            assert "Example (another task):" in msgs[0]["content"] and msgs[1]["role"] == "user"
        else:
            assert "Example (another task):" not in msgs[0]["content"]
        assert msgs[-1]["role"] == {"read": "user", "act": "tool", "done": "tool"}[stage]


def test_each_stage_check_accepts_the_right_reply_and_rejects_wrong_ones():
    cells = [c for c in bench.cases(1) if c[2] == "turns"]
    done_history = {fam: msgs for fam, stage, _, msgs, _ in cells if stage == "done"}
    for fam, stage, _, msgs, right in cells:
        task_text = next(m["content"] for m in reversed(msgs) if m["role"] == "user")
        path = task_text.split("`cat ", 1)[1].split("`", 1)[0]
        if stage == "read":
            assert right(_call(f"cat {path}")), (fam, task_text)
            assert not right(_call("ls")) and not right("Done.")
        elif stage == "act":
            reference = done_history[fam][-2]["content"]  # the done stage's history holds the reference call
            assert done_history[fam][-2]["role"] == "assistant" and "<tool_call>" in reference
            assert right(reference), (fam, reference)
            assert not right(_call(f"cat {path}")) and not right("Done."), fam
            assert "Result (bash)" in msgs[-1]["content"]
        else:
            assert right("Done: I created it.") and not right(_call("ls")), fam
