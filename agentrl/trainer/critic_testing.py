"""Small real inputs for ``CriticTrainer`` tests: synthetic multi-turn critic batches and a
runner that compares set-ups (micro-batch sizes, 1 vs N ranks), like
``agentrl.trainer.testing`` does for ``PolicyTrainer``. Nothing here is a fake: the batches
go through ``ValueBatch.pack`` and the model is a real (tiny, random) Llama.
"""

from __future__ import annotations

import torch

from agentrl.trainer.critic_trainer import CriticConfig, CriticTrainer
from agentrl.types import ValueBatch, ValueRow
from agentrl.trainer.testing import TINY_VOCAB, full_grads
from critics.turn_critic import turn_boundaries


def make_critic_batch(
    *,
    num_rows: int = 6,
    seed: int = 0,
    max_turns: int = 3,
    with_old_values: bool = False,
    vocab_size: int = TINY_VOCAB,
) -> ValueBatch:
    """``num_rows`` rows of 1..``max_turns`` turns; each turn a prompt/observation of 1..4
    tokens and a completion of 1..4 tokens. Returns ~ N(0, 1); old values (when asked)
    returns plus N(0, 0.5^2) noise, so value clipping is active on some turns.
    Deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(num_rows):
        k = int(torch.randint(1, max_turns + 1, (1,), generator=g))
        p = torch.randint(1, 5, (k,), generator=g).tolist()
        c = torch.randint(1, 5, (k,), generator=g).tolist()
        n = sum(p) + sum(c)
        ids = torch.randint(0, vocab_size, (n,), generator=g).tolist()
        ret = torch.randn(k, generator=g)
        old = (ret + 0.5 * torch.randn(k, generator=g)).tolist() if with_old_values else None
        rows.append(
            ValueRow(input_ids=ids, positions=turn_boundaries(p, c), returns=ret.tolist(), old_values=old, episode_id=f"ep{i}")
        )
    return ValueBatch.pack(rows)


def critic_full_state_dict(trainer: CriticTrainer) -> dict[str, torch.Tensor]:
    """Unsharded CPU copy of the critic's weights (``backbone.*``, ``head.*``). Collective;
    every rank gets the dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone() for k, v in sd.items()}


def run_critic_cases(model_path: str, cases: dict[str, dict]) -> dict[str, dict]:
    """For each case ``{"batch": make_critic_batch kwargs, "config": CriticConfig kwargs}``:
    a fresh ``CriticTrainer``, ``compute_values``, one ``step``; collect ``values``,
    ``metrics``, ``grads`` (after the last backward, clipped) and ``weights`` (after the
    update). Collective; rank 0 gets the results, other ranks ``{}``."""
    import torch.distributed as dist

    results: dict[str, dict] = {}
    for name, case in cases.items():
        trainer = CriticTrainer(CriticConfig(model_path=model_path, **case.get("config", {})))
        batch = make_critic_batch(**case.get("batch", {}))
        values = trainer.compute_values(batch)
        metrics = trainer.step(batch)
        grads = full_grads(trainer)  # type: ignore[arg-type]  # reads .model only
        weights = critic_full_state_dict(trainer)
        if dist.get_rank() == 0:
            results[name] = {"values": values, "metrics": metrics, "grads": grads, "weights": weights}
    return results


def critic_two_rank_worker(rank: int, world_size: int, port: int, model_path: str, cases: dict, out_file: str) -> None:
    """``torch.multiprocessing.spawn`` target: join a gloo group on 127.0.0.1:``port``, run
    ``run_critic_cases``, and have rank 0 ``torch.save`` the results to ``out_file``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        results = run_critic_cases(model_path, cases)
        if rank == 0:
            torch.save(results, out_file)
    finally:
        dist.destroy_process_group()
