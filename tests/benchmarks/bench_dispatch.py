"""Benchmark: what dispatching a batch in chunks costs a rollout engine, the measurement
behind ``agentrl.cluster.engines.pool``'s up-front split.

Run on demand (pytest does not collect this file)::

    .venv/bin/python tests/benchmarks/bench_dispatch.py                # tiny model
    .venv/bin/python tests/benchmarks/bench_dispatch.py --model smollm2-135m-instruct --requests 16 --new-tokens 64

One ``RolloutActor`` rolls out the same requests (``--env``, default GuessNumber, groups
of 4) once in a single call, then again as consecutive calls of ``--chunks`` requests each,
as a pool that hands out small chunks to a one-call-at-a-time actor would; then an
``EnginePool`` of ``--engines`` engines rolls them out once. Prints generated tokens/s of
each. Every call uses the same per-request sampling seeds, so each variant generates the
same episodes (up to numerics).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-random-smollm2", help="model-zoo name or local folder")
    ap.add_argument("--env", default="agentrl/GuessNumber-v0")
    ap.add_argument("--requests", type=int, default=32, help="episodes (a multiple of 4: groups of 4)")
    ap.add_argument("--new-tokens", type=int, default=48, help="rollout.max_new_tokens")
    ap.add_argument("--chunks", type=int, nargs="+", default=[8, 4], help="chunk sizes to compare with one call")
    ap.add_argument("--engines", type=int, default=2, help="engines of the pool run (0: skip it)")
    ap.add_argument("--threads", type=int, default=2, help="OMP threads per actor")
    args = ap.parse_args()

    import ray

    from agentrl.cluster.actors.env_factory import env_task_ids

    from agentrl.cluster.actors.rollout_actor import RolloutActor
    from agentrl.cluster.engines.pool import EnginePool
    from agentrl.config import load_config
    from agentrl.model_zoo import resolve_model_path
    from agentrl.tasks import TaskSource

    model = resolve_model_path(args.model)  # a model-zoo name is prepared once, a folder used as it is
    cfg = load_config(None, [f"model.path={model}", f"env.id={args.env}", "rollout.max_turns=2",
                             f"rollout.max_new_tokens={args.new_tokens}", "rollout.max_context_tokens=2048",
                             f"rollout.num_engines={max(1, args.engines)}", "run.dir=/tmp/agentrl-bench-dispatch",
                             "cluster.placement.rollout.num_cpus=0.5"])
    cfg_dict = cfg.model_dump(mode="json")
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}})
    try:
        tasks = TaskSource(cfg.env.id, env_task_ids(cfg.env.id, cfg.env.split), 0, 4, run_id="bench")
        reqs = tasks.next_requests(max(1, args.requests // 4))
        actor = RolloutActor.options(num_cpus=0.5).remote(cfg_dict, model, "bench", 0)
        ray.get(actor.ready.remote())
        ray.get(actor.rollout.remote(reqs[:4], 0))  # warm-up
        for chunk in [len(reqs), *args.chunks]:
            t0, toks = time.perf_counter(), 0
            for i in range(0, len(reqs), chunk):
                eps, _ = ray.get(actor.rollout.remote(reqs[i:i + chunk], 0))
                toks += sum(e.num_generated_tokens() for e in eps)
            dt = time.perf_counter() - t0
            label = "one call" if chunk == len(reqs) else f"chunks of {chunk}"
            print(f"1 engine, {len(reqs)} episodes, {label:>13}: {dt:6.2f} s  {toks:6d} tokens  {toks / dt:7.1f} tokens/s",
                  flush=True)
        ray.kill(actor)
        if args.engines > 0:
            pool = EnginePool(cfg, cfg_dict, model, "bench")
            pool.ready()
            pool.rollout(reqs[:4 * args.engines], 0)  # warm-up
            t0 = time.perf_counter()
            eps, _, m = pool.rollout(reqs, 0)
            dt = time.perf_counter() - t0
            toks = sum(e.num_generated_tokens() for e in eps)
            split = ", ".join(f"{int(m[f'rollout/engine_{i}_episodes'])}" for i in pool.engine_indices)
            print(f"pool of {args.engines} engines, {len(reqs)} episodes (split {split}): {dt:6.2f} s  {toks:6d} tokens  "
                  f"{toks / dt:7.1f} tokens/s", flush=True)
            pool.kill()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
