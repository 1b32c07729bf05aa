"""Small real inputs for the trainer tests (``PolicyTrainer`` and ``CriticTrainer``): a tiny
random Llama folder, synthetic policy and critic batches, and runners that compare set-ups
(micro-batch sizes, 1 vs N ranks).

Test code, not production: imported as ``tests.helpers.trainer`` by tests/conftest.py,
tests/integration/trainer and tests/invariants (pytest is run from the repository root
with ``python -m pytest``, which puts the root on ``sys.path``; ``torch.multiprocessing``
spawn children inherit it). Nothing here is a fake: the model is a real (random) Llama
and the batches go through ``TokenBatch.pack`` / ``ValueBatch.pack``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from agentrl.types import SamplingRecord, TokenBatch, TokenSequence, ValueBatch, ValueRow
from critics.turn_critic import turn_boundaries

if TYPE_CHECKING:
    from agentrl.trainer.critic_trainer import CriticTrainer
    from agentrl.trainer.trainer import PolicyTrainer

TINY_VOCAB = 256


def make_tiny_llama(path: str | os.PathLike[str], *, seed: int = 0, tie_word_embeddings: bool = False) -> str:
    """Write a random 2-layer Llama (vocab 256, hidden 64, head_dim 32, about 0.1 M
    parameters) with ``save_pretrained`` to ``path``; no tokenizer. Deterministic for a
    given ``seed`` (torch CPU RNG). Returns ``str(path)``."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
    )
    state = torch.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_rng_state(state)
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return str(path)


def make_batch(
    *,
    num_rows: int = 6,
    seed: int = 0,
    temperature: float = 1.0,
    vocab_size: int = TINY_VOCAB,
    min_len: int = 5,
    max_len: int = 14,
    multi_turn: bool = True,
) -> TokenBatch:
    """A packed batch of ``num_rows`` rows of varied lengths, in groups of two.

    Each row: a prompt (``loss_mask`` 0), a completion (1), and when ``multi_turn`` an
    observation (0) and a second completion (1). Advantages are a per-row constant on
    loss tokens (mixed signs); behavior log-probs are plausible negative numbers (not the
    model's: the trainer reports the gap). Deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(num_rows):
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(0, vocab_size, (n,), generator=g).tolist()
        n_prompt = max(1, n // 4)
        mask = [0] * n_prompt + [1] * (n - n_prompt)
        if multi_turn and n - n_prompt >= 4:
            a = n_prompt + (n - n_prompt) // 2
            mask[a : a + 2] = [0, 0]  # an observation between two completions
        n_loss = sum(mask)
        adv_value = float(torch.randn((), generator=g))
        advantages = [adv_value if m else 0.0 for m in mask]
        blp = (-torch.rand(n_loss, generator=g) * 6.0).tolist()
        rows.append(
            TokenSequence(
                input_ids=ids,
                loss_mask=mask,
                behavior_log_probs=blp,
                advantages=advantages,
                group_id=f"g{i // 2}",
                policy_version=0,
                episode_id=f"ep{i}",
            )
        )
    return TokenBatch.pack(rows, SamplingRecord(temperature=temperature))


def off_policy_batch(
    batch: TokenBatch, log_probs: torch.Tensor, *, proximal_noise: float, behavior_noise: float, seed: int = 0
) -> TokenBatch:
    """``batch`` re-packed (``TokenBatch.pack``) as off-policy data: on its loss tokens,
    ``proximal_log_probs = log_probs + N(0, proximal_noise^2)`` (``log_probs``: the model's,
    ``[T]``, so the current / proximal ratio starts near 1) and ``behavior_log_probs =
    proximal + N(0, behavior_noise^2)`` (the engine drifted from the trainer).
    Deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    on = batch.loss_mask > 0  # (T,)
    prox = log_probs.clone()  # (T,)
    prox[on] += proximal_noise * torch.randn(int(on.sum()), generator=g)
    behavior = prox[on] + behavior_noise * torch.randn(int(on.sum()), generator=g)  # (n_loss,)
    rows, start = [], 0
    for i, s in enumerate(batch.row_slices()):
        mask = batch.loss_mask[s].long().tolist()
        n = sum(mask)
        rows.append(
            TokenSequence(
                input_ids=batch.input_ids[s].tolist(),
                loss_mask=mask,
                behavior_log_probs=behavior[start : start + n].tolist(),
                advantages=batch.advantages[s].tolist(),
                group_id=batch.group_ids[i],
                policy_version=int(batch.policy_versions[i]),
                episode_id=batch.episode_ids[i],
            )
        )
        start += n
    return TokenBatch.pack(rows, batch.sampling, proximal_log_probs=prox)


def full_grads(trainer: "PolicyTrainer | CriticTrainer") -> dict[str, torch.Tensor]:
    """Unsharded copy of every parameter's current gradient of ``trainer.model``, by
    parameter name. Collective."""
    out = {}
    for name, p in trainer.model.named_parameters():
        g = p.grad
        if g is None:
            continue
        out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().cpu().clone()
    return out


def run_trainer_cases(model_path: str, cases: dict[str, dict]) -> dict[str, dict]:
    """For each case ``{"batch": make_batch kwargs, "config": TrainerConfig kwargs}`` (and
    optionally ``"off_policy": off_policy_batch kwargs``, applied with the scored
    log-probs): build a fresh ``PolicyTrainer``, score the batch, take one ``step``, and
    collect ``log_probs``, ``metrics``, ``grads`` (after the step's last backward, clipped),
    ``weights`` (after the update) and ``token_values`` (the step's ``(log_probs,
    entropies)``: what the replay store keeps). Collective; rank 0 gets the results, other ranks
    ``{name: {"metrics": ...}}`` only. Used to compare set-ups that must agree (micro-batch
    sizes, world sizes)."""
    import torch.distributed as dist

    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.trainer import PolicyTrainer

    results: dict[str, dict] = {}
    for name, case in cases.items():
        trainer = PolicyTrainer(TrainerConfig(model_path=model_path, **case.get("config", {})))
        batch = make_batch(**case.get("batch", {}))
        log_probs = trainer.compute_log_probs(batch)
        if "off_policy" in case:
            batch = off_policy_batch(batch, log_probs, **case["off_policy"])
        step = trainer.step(batch)
        metrics = step.metrics
        grads = full_grads(trainer)
        weights = trainer.full_state_dict()
        if dist.get_rank() == 0:
            results[name] = {"log_probs": log_probs, "metrics": metrics, "grads": grads, "weights": weights,
                             "token_values": (step.log_probs, step.entropies)}
        else:
            results[name] = {"metrics": metrics}
    return results


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_on_gloo_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2) -> list[Any]:
    """Run ``fn(*args)`` once on each of ``world_size`` spawned processes joined in one gloo
    process group (127.0.0.1, a free port; one torch thread each) and return what each rank
    returned, in rank order. ``fn`` must be importable by name (module level) and its
    result picklable by ``torch.save``.

    Raises:
        torch.multiprocessing.ProcessRaisedException: ``fn`` raised on a rank (with its
            traceback).
    """
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="gloo-ranks-") as out_dir:
        mp.spawn(_gloo_rank_main, args=(world_size, free_port(), out_dir, fn, args), nprocs=world_size, join=True)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def _gloo_rank_main(rank: int, world_size: int, port: int, out_dir: str, fn: Callable[..., Any], args: tuple) -> None:
    """``mp.spawn`` target of ``run_on_gloo_ranks``. On success the process leaves with
    ``os._exit(0)``, not through interpreter shutdown: gloo's worker threads retire a
    finished collective's work (dropping the last reference to its tensors, which takes
    the GIL) just after the caller's ``wait`` returns, and a thread that asks for the GIL
    while the interpreter finalizes is ended by CPython inside a noexcept destructor:
    ``std::terminate``, SIGABRT ("terminate called without an active exception";
    pytorch/pytorch#190489). ``destroy_process_group`` does not join those threads, as
    DTensor's sharding caches keep the group alive. A rank that raises leaves through
    ``mp.spawn``'s own path, which records the traceback first."""
    import sys

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result = fn(*args)
    finally:
        dist.destroy_process_group()
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------------------- critic


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


def critic_full_state_dict(trainer: "CriticTrainer") -> dict[str, torch.Tensor]:
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

    from agentrl.trainer.config import CriticConfig
    from agentrl.trainer.critic_trainer import CriticTrainer

    results: dict[str, dict] = {}
    for name, case in cases.items():
        trainer = CriticTrainer(CriticConfig(model_path=model_path, **case.get("config", {})))
        batch = make_critic_batch(**case.get("batch", {}))
        values = trainer.compute_values(batch)
        metrics = trainer.step(batch)
        grads = full_grads(trainer)
        weights = critic_full_state_dict(trainer)
        if dist.get_rank() == 0:
            results[name] = {"values": values, "metrics": metrics, "grads": grads, "weights": weights}
    return results
