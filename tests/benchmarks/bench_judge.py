"""Benchmark: a judge on MathAnswer-v0's labelled answers: its accuracy against the labels,
beside the rule checker's, its throughput, and the cache on a second pass.

Run on demand (pytest does not collect this file)::

    .venv/bin/python tests/benchmarks/bench_judge.py                          # SmolLM2-135M, a local pool
    .venv/bin/python tests/benchmarks/bench_judge.py --model Qwen/Qwen2.5-7B-Instruct --engines 1 --split all
    .venv/bin/python tests/benchmarks/bench_judge.py --base-url http://127.0.0.1:8000/v1 --model NAME

What it does, with the run's own parts (``EpisodeScorer`` over the judge of ``reward.judge``
and the judge cache of a replay store in a temporary directory):

1. every labelled (task, answer) of ``--split`` becomes a ``JudgeItem`` (the task's question,
   its reference, the answer) judged with MathAnswer-v0's rubric (``judge_rubric``) under
   ``reward.combine: judge``; a score >= 0.5 says "equivalent";
2. accuracy against the labels, for the judge and for the env's rule checker
   (``rule_equivalent``) on the same answers; the judge's misses split into false accepts and
   false rejects; answers it failed to judge are counted apart (a reward error in a run);
3. throughput: judged answers per second of the first pass, all submitted at once (the pool
   batches them; ``--concurrency`` bounds the calls in flight);
4. the same answers judged again: the cache hit rate (every answer already judged should be
   served by the cache) and that pass's answers per second.

``--engines`` / ``--model`` / ``--dtype`` size a local pool (``kind: pool``, guided JSON
decoding); ``--base-url`` uses an OpenAI-compatible server instead (``kind: endpoint``). On a
GPU machine, the same command with a larger judge.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ray  # noqa: E402

from agentrl.cluster.actors.judge_service import judge_settings, make_judge, run_rubric  # noqa: E402
from agentrl.config import load_config  # noqa: E402
from agentrl.replay import ReplayStore  # noqa: E402
from agentrl.rewards.scorer import EpisodeScorer  # noqa: E402
from agentrl.types import Episode, JudgeItem  # noqa: E402
from environments.math_answer import MathAnswerEnv, load_tasks  # noqa: E402


def _items(split: str, limit: int | None) -> list[tuple[JudgeItem, bool, bool]]:
    """``(item, label, rule's verdict)`` per labelled answer of ``split`` (``all``: both)."""
    tasks = {t.task_id: t for t in load_tasks()}
    out = []
    for s in (("train", "test") if split == "all" else (split,)):
        for task_id, answer, label in MathAnswerEnv.labelled_answers(s):
            t = tasks[task_id]
            item = JudgeItem(task=t.question, reference=t.reference, answer=answer, rule_reward=0.0)
            out.append((item, bool(label), MathAnswerEnv.rule_equivalent(t.reference, answer)))
    return out[:limit] if limit else out


def _pass(scorer: EpisodeScorer, items: list[tuple[JudgeItem, bool, bool]]) -> tuple[list, float]:
    ep = Episode(group_id="bench", env_id="agentrl/MathAnswer-v0", task_id="bench", seed=0)
    t0 = time.perf_counter()
    futures = [scorer.submit(ep, it) for it, _, _ in items]
    records = [f.result() for f in futures]
    return records, time.perf_counter() - t0


def _accuracy(verdicts: list[bool | None], labels: list[bool]) -> tuple[float, int, int, int]:
    """(accuracy over judged answers, false accepts, false rejects, not judged)."""
    judged = [(v, lab) for v, lab in zip(verdicts, labels) if v is not None]
    right = sum(v == lab for v, lab in judged)
    fa = sum(v and not lab for v, lab in judged)
    fr = sum(lab and not v for v, lab in judged)
    return (right / len(judged) if judged else float("nan")), fa, fr, len(verdicts) - len(judged)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="judge model (pool: a model.path value)")
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible server instead of a local pool")
    ap.add_argument("--engines", type=int, default=1, help="local pool: judge engines")
    ap.add_argument("--dtype", default="auto", help="local pool: engine dtype")
    ap.add_argument("--split", default="test", choices=("train", "test", "all"))
    ap.add_argument("--limit", type=int, default=None, help="judge only the first N labelled answers")
    ap.add_argument("--concurrency", type=int, default=16, help="judge calls in flight")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="one judge call's limit (a busy CPU is slow)")
    ap.add_argument("--max-tokens", type=int, default=128, help="most tokens of one judge answer")
    args = ap.parse_args()

    items = _items(args.split, args.limit)
    labels = [lab for _, lab, _ in items]
    rule_acc, rule_fa, rule_fr, _ = _accuracy([r for _, _, r in items], labels)
    kind = ["reward.judge.kind=endpoint", f"reward.judge.base_url={args.base_url}"] if args.base_url else [
        "reward.judge.kind=pool", f"reward.judge.num_engines={args.engines}", f"reward.judge.dtype={args.dtype}"]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [f"run.dir={tmp}", "env.id=agentrl/MathAnswer-v0", f"reward.judge.model={args.model}",
                                 f"reward.judge.max_tokens={args.max_tokens}",
                                 f"reward.judge.max_concurrency={args.concurrency}", f"reward.judge.timeout_s={args.timeout_s}",
                                 "reward.combine=judge", *kind])
        ray.init(num_cpus=max(2, args.engines + 1), include_dashboard=False, log_to_driver=False)
        store = ReplayStore(f"sqlite:///{tmp}/replay.db")
        judge = make_judge(cfg)
        try:
            t0 = time.perf_counter()
            judge.check()
            print(f"judge {args.model} ready in {time.perf_counter() - t0:.1f} s "
                  f"({'endpoint ' + args.base_url if args.base_url else f'{args.engines} local engine(s)'})")
            scorer = EpisodeScorer(run_rubric(cfg), judge.complete, model=args.model, combine_mode="judge",
                                   judge_settings=judge_settings(cfg.reward.judge),
                                   cache_get=lambda k: store.judge_cache_get([k]).get(k),
                                   cache_put=lambda *e: store.judge_cache_put([e]), max_workers=args.concurrency)
            first, first_s = _pass(scorer, items)
            again, again_s = _pass(scorer, items)
        finally:
            stop = getattr(judge, "engines", None)
            if stop is not None:
                from agentrl.cluster.actors.judge_pool import stop_judge_pool

                stop_judge_pool(judge)
            store.close()
            ray.shutdown()
    verdicts = [None if r.score is None else r.score >= 0.5 for r in first]
    acc, fa, fr, failed = _accuracy(verdicts, labels)
    n = len(items)
    hits = sum(r.cached for r in again)
    print(f"labelled answers: {n} ({sum(labels)} equivalent) from split {args.split}")
    print(f"rule checker : accuracy {rule_acc:.3f}  false accepts {rule_fa}  false rejects {rule_fr}")
    print(f"judge        : accuracy {acc:.3f}  false accepts {fa}  false rejects {fr}  not judged {failed}")
    print(f"throughput   : {n / first_s:.2f} answers/s ({first_s:.1f} s, {scorer.stats['calls']} calls, "
          f"{scorer.stats['parse_errors']} unparseable)")
    print(f"second pass  : cache hit rate {hits / n:.3f} ({hits}/{n}), {n / again_s:.1f} answers/s")
    print(f"ratio judge/rule accuracy: {acc / rule_acc:.3f}")


if __name__ == "__main__":
    main()
