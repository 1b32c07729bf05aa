"""Benchmark: an agent through the gateway against the in-process env on the same work, and
many concurrent sessions on one engine.

Run on demand (pytest does not collect this file)::

    .venv/bin/python tests/benchmarks/bench_gateway.py                  # tiny random model
    .venv/bin/python tests/benchmarks/bench_gateway.py --model smollm2-135m-instruct --episodes 16

One real vLLM engine (vLLM's CPU build, fp32) and the real rollout loop (``RolloutWorker``),
no Ray. The same work both ways, in one process, the in-process run first and then the
gateway run, each ``--rounds`` times interleaved (best of each kept, against a shared
machine's noise):

* ``in-process``: ``BenchTask`` episodes: every step answers with a tool message
  (``tool result k``) until ``--turns`` turns, then ends.
* ``gateway``: the agent ``bench_agent`` (the ``openai`` SDK's ``AsyncOpenAI``) over the same
  task env: it calls the model, appends the reply and the same tool message, ``--turns``
  times, then returns. The rollout loop samples the same number of turns of at most
  ``--max-new-tokens`` each, from the same seeds.

tokens/s = sampled tokens (every turn's completion) / the ``worker.run`` call's wall seconds;
the line ``ratio`` is gateway / in-process (the target is >= 0.9).

``--sessions`` (default 256) agent episodes then run at once on the engine (two turns of at
most 16 tokens each): every episode must come back without an error, none lost. Added
latency per call: the client's round trip minus the rollout's share (from the env taking
the call to its answer: the engine's sampling included), i.e. HTTP, checks, rendering and
thread hand-offs; p50 and p99 over every call of the concurrent run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gymnasium  # noqa: E402

from agentrl.gateway import register_agent_env  # noqa: E402
from agentrl.gateway.session import AgentSession  # noqa: E402
from agentrl.rollout.chat import ChatTokenizer  # noqa: E402
from agentrl.rollout.loop import RolloutLimits, RolloutWorker  # noqa: E402
from agentrl.types import EpisodeRequest, SamplingRecord  # noqa: E402
from environments.core import TextEnv  # noqa: E402

TURNS = {"n": 3}
RTTS: dict[tuple[str, int], float] = {}
CALLS: dict[str, list] = {}
_LOCK = threading.Lock()


class BenchTask(TextEnv):
    """A tool message per step until ``TURNS["n"]`` turns; no sandbox."""

    uses_sandbox = False

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        return [f"b{i}" for i in range(1024)]

    def reset(self, *, seed=None, options=None):
        self._task_id, self._done, self.k = self._start_reset(seed, options), False, 0
        return f"Task {self._task_id}: call the tool a few times.", {"system_prompt": "You are a benchmark agent."}

    def step(self, action):
        self._check_step(action)
        self.k += 1
        done = self.k >= TURNS["n"]
        self._done = done
        return f"tool result {self.k}", 0.0, done, False, {"observation_role": "tool"}


async def bench_agent(task, client):
    messages = list(task.messages)
    sid = str(client.base_url).rstrip("/").split("/")[-2]
    for k in range(1, TURNS["n"] + 1):
        t0 = time.monotonic()
        r = await client.chat.completions.create(model="policy", messages=messages)
        with _LOCK:
            RTTS[(sid, k)] = time.monotonic() - t0
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "content": f"tool result {k}"})
    return 0.0


gymnasium.register(id="bench/Task-v0", entry_point=BenchTask)
register_agent_env("bench/Agent-v0", agent=bench_agent, task_env="bench/Task-v0")

_submit = AgentSession.submit


def _recording_submit(self, request):  # the benchmark's probe: every call of every session
    call = _submit(self, request)
    with _LOCK:
        CALLS.setdefault(self.session_id, []).append(call)
    return call


AgentSession.submit = _recording_submit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-random-smollm2")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=256, help="concurrent sessions; 0: skip that part")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from agentrl.model_zoo import prepare_model
    from agentrl.rollout.engine import VLLMEngine

    path = str(prepare_model(args.model)) if not os.path.isdir(args.model) else args.model
    tok = AutoTokenizer.from_pretrained(path)
    engine = VLLMEngine(path, dtype="float32", max_model_len=2048, seed=0, max_num_seqs=max(args.episodes, 64),
                        kv_cache_gb=1.0, decode=tok.decode)
    # the random model rarely samples <|im_end|>: with ~1,200 more ids declared stop ids a turn
    # ends by "stop" after ~40 tokens on average (as tests/integration/rollout do), so
    # episodes run several turns; a turn cut at --max-new-tokens ends its episode (the loop's
    # rule) alike in both runs, which sample the same ids from the same seeds
    chat = ChatTokenizer(tok, (2,) + tuple(range(3, 1230)) if "random" in args.model else (2,))
    print(f"model {args.model}; {args.episodes} episodes x {args.turns} turns x <= {args.max_new_tokens} new tokens; "
          f"load average {os.getloadavg()[0]:.2f}")

    def worker(env_workers: int, max_new_tokens: int) -> RolloutWorker:
        return RolloutWorker(engine, chat, lambda req: (gymnasium.make(req.env_id, disable_env_checker=True), None),
                             RolloutLimits(max_turns=TURNS["n"], max_new_tokens=max_new_tokens, max_context_tokens=2048),
                             SamplingRecord(temperature=1.0), env_workers=env_workers, env_timeout_s=600)

    def run(env_id: str, n: int, w: RolloutWorker, tag: str) -> tuple[float, int, list]:
        reqs = [EpisodeRequest(env_id=env_id, task_id=f"b{i}", seed=i, group_id=f"{tag}{i}", sample_seed=i)
                for i in range(n)]
        t0 = time.perf_counter()
        eps = w.run(reqs, policy_version=0)
        wall = time.perf_counter() - t0
        return wall, sum(len(t.completion_ids) for e in eps for t in e.turns), eps

    TURNS["n"] = args.turns
    w = worker(max(8, args.episodes), args.max_new_tokens)
    run("bench/Task-v0", 2, w, "warm")  # compile-free warm-up of both paths
    run("bench/Agent-v0", 2, w, "warmg")
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for name, env_id in (("in-process", "bench/Task-v0"), ("gateway", "bench/Agent-v0")):
            engine.reset_prefix_cache()
            wall, toks, eps = run(env_id, args.episodes, w, f"{name[0]}{r}-")
            errors = [e.error for e in eps if e.error]
            assert not errors, errors[:2]
            rate = toks / wall
            best[name] = max(best.get(name, 0.0), rate)
            print(f"round {r}: {name:10s} {toks} tokens in {wall:.2f} s = {rate:.1f} tokens/s")
    print(f"best: in-process {best['in-process']:.1f} tokens/s, gateway {best['gateway']:.1f} tokens/s; "
          f"ratio gateway/in-process {best['gateway'] / best['in-process']:.3f} (target >= 0.9)")

    if not args.sessions:
        return
    TURNS["n"] = 2
    RTTS.clear()
    CALLS.clear()
    w = worker(args.sessions + 8, 16)
    wall, toks, eps = run("bench/Agent-v0", args.sessions, w, "many")
    errors = [e.error for e in eps if e.error]
    lost = args.sessions - len({e.episode_id for e in eps if e.turns})
    added = []
    for sid, calls in CALLS.items():
        for k, call in enumerate(calls, start=1):
            if (sid, k) in RTTS and call.taken_s is not None and call.answered_s is not None:
                added.append(RTTS[(sid, k)] - (call.answered_s - call.taken_s))
    added.sort()
    q = statistics.quantiles(added, n=100) if len(added) >= 2 else [float("nan")] * 99
    print(f"{args.sessions} concurrent sessions: {len(eps)} episodes back in {wall:.1f} s, {len(errors)} errors, "
          f"{lost} lost (no turn); {len(added)} calls; added latency per call "
          f"p50 {q[49] * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
