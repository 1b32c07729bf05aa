"""Weight sync, proven: after an update is synced, vLLM's log-probs of a fixed sequence equal
the trainer's (fp32 engine and trainer, max abs gap < 1e-4), and before the sync they do not;
through ``agentrl.cluster.engines.weight_sync.sync_weights`` to two engines, on the object-store path
and on the collective path (gloo on CPU: trainer rank 0 broadcasting to both engines over a
group of its own), with the engines loading in place (not vLLM's generic reload).
The collective path's group is also tested alone (three actor processes, gloo; a member that
never arrives; NCCL where two GPUs exist). Also case C04's engine part: at equal weights, the
engine's behavior_log_probs of sampled tokens equal the trainer's recomputation at the
sampling temperature, T in {0.6, 1.0, 1.5}."""

from __future__ import annotations

import socket

import pytest
import torch

from agentrl.cluster.engines.weight_sync import GroupSpec
from agentrl.types import SamplingRecord, TokenBatch, TokenSequence

pytestmark = pytest.mark.slow
TOL = 1e-4


@pytest.fixture(scope="module")
def actors(ray_session, tmp_path_factory, tiny_model_path):
    from agentrl.cluster.actors.rollout_actor import RolloutActor
    from agentrl.cluster.actors.trainer_group import TrainerGroup
    from agentrl.config import load_config

    cfg = load_config(None, [f"run.dir={tmp_path_factory.mktemp('ws')}", f"model.path={tiny_model_path}",
                             "trainer.lr=3e-3", "rollout.max_context_tokens=512", "rollout.max_new_tokens=16"])
    d = cfg.model_dump(mode="json")
    group = TrainerGroup(cfg, d, tiny_model_path, {"num_cpus": 1})
    rollout = RolloutActor.remote(d, tiny_model_path, "test-weight-sync")
    second = RolloutActor.remote(d, tiny_model_path, "test-weight-sync", engine_index=1)
    ray_session.get([rollout.ready.remote(), second.ready.remote()])
    group.ready()
    yield ray_session, group.actors[0], rollout, second
    ray_session.kill(rollout)
    ray_session.kill(second)
    group.kill()


def _batch(ids, lps=None, temperature=1.0, adv=1.0):
    mask = [0] + [1] * (len(ids) - 1)
    lps = lps if lps is not None else [-1.0] * (len(ids) - 1)
    row = TokenSequence(ids, mask, lps, [0.0] + [adv] * (len(ids) - 1), "g", 0, "e")
    return TokenBatch.pack([row], SamplingRecord(temperature=temperature))


def test_sync_makes_engine_match_trainer(actors):
    ray, trainer, rollout, _ = actors
    seq = [1, 4093, 198, 33, 3060, 314, 216, 34, 1225, 28, 216, 35, 47, 2]
    batch = _batch(seq)
    engine_before = torch.tensor(ray.get(rollout.prompt_log_probs.remote(seq)))
    trainer_before = ray.get(trainer.compute_log_probs.remote(batch))[1:]
    assert (engine_before - trainer_before).abs().max().item() < TOL  # equal weights, equal numbers

    ray.get(trainer.step.remote(_batch(seq, trainer_before.tolist(), adv=1.0)))
    trainer_after = ray.get(trainer.compute_log_probs.remote(batch))[1:]
    moved = (trainer_after - trainer_before).abs().max().item()
    assert moved > 100 * TOL  # the update is real
    stale = torch.tensor(ray.get(rollout.prompt_log_probs.remote(seq)))
    assert (stale - trainer_after).abs().max().item() > 10 * TOL  # engine has not seen it yet

    ref = ray.get(trainer.state_dict_ref.remote())
    ray.get(rollout.update_weights.remote(ref))
    synced = torch.tensor(ray.get(rollout.prompt_log_probs.remote(seq)))
    gap = (synced - trainer_after).abs().max().item()
    print(f"weight sync: update moved log-probs by up to {moved:.3e}; engine-trainer gap after sync {gap:.3e}")
    assert gap < TOL
    assert ray.get(rollout.last_weight_load.remote())["method"] == "in_place"


SEQ = [1, 4093, 198, 33, 3060, 314, 216, 34, 1225, 28, 216, 35, 47, 2]


def _step_and_sync(ray, trainer, engines, method):
    """One real update, then ``sync_weights``; returns (metrics, trainer's log-probs after,
    each engine's log-probs after)."""
    from agentrl.cluster.engines.weight_sync import sync_weights

    batch = _batch(SEQ)
    before = ray.get(trainer.compute_log_probs.remote(batch))[1:]
    ray.get(trainer.step.remote(_batch(SEQ, before.tolist(), adv=1.0)))
    after = ray.get(trainer.compute_log_probs.remote(batch))[1:]
    assert (after - before).abs().max().item() > 100 * TOL  # the update is real
    stale = [torch.tensor(x) for x in ray.get([e.prompt_log_probs.remote(SEQ) for e in engines])]
    assert all((s - after).abs().max().item() > 10 * TOL for s in stale)  # not synced yet
    m = sync_weights([trainer], engines, method=method, timeout_s=60)
    synced = [torch.tensor(x) for x in ray.get([e.prompt_log_probs.remote(SEQ) for e in engines])]
    return m, after, synced


@pytest.mark.parametrize("method", ["object_store", "collective"])
def test_sync_weights_to_two_engines(actors, method):
    ray, trainer, first, second = actors
    engines = [first, second]
    m, after, synced = _step_and_sync(ray, trainer, engines, method)
    gaps = [(s - after).abs().max().item() for s in synced]
    print(f"{method}: gaps {gaps}, metrics {m}")
    assert max(gaps) < TOL
    assert {"sync/gather_s", "sync/engine_0_s", "sync/engine_1_s", "sync/total_s", "sync/mb"} <= set(m)
    assert m["sync/total_s"] >= max(m["sync/engine_0_s"], m["sync/engine_1_s"]) > 0
    assert [ray.get(e.last_weight_load.remote())["method"] for e in engines] == ["in_place", "in_place"]
    if method == "collective":
        assert "sync/group_setup_s" in m and m["sync/broadcast_s"] > 0
        m2, after2, synced2 = _step_and_sync(ray, trainer, engines, method)  # the group is kept
        assert "sync/group_setup_s" not in m2
        assert max((s - after2).abs().max().item() for s in synced2) < TOL
        m3, after3, synced3 = _step_and_sync(ray, trainer, [second], method)  # another set of engines: new group
        assert "sync/group_setup_s" in m3 and "sync/engine_1_s" not in m3
        assert (synced3[0] - after3).abs().max().item() < TOL
        from agentrl.cluster.engines.weight_sync import sync_weights

        sync_weights([trainer], engines)  # both engines at the trainer's weights again (C04 needs equal weights)


def test_input_embedding_gemm_is_rebuilt_at_first_use_from_the_new_weights(actors):
    """``weight_load`` defers the input embedding's GEMM handler (unused by Llama-like models)
    to its first use: if it is used, it is exactly the handler an eager repack builds."""
    ray, trainer, rollout, _ = actors
    from agentrl.cluster.engines.weight_sync import sync_weights

    def _input_embedding_gemm(actor_self):
        """In the engine: the input embedding's GEMM (what a model multiplying by it would call)
        after an in-place load, against the same GEMM rebuilt eagerly from the loaded weight."""
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

        def check(model):
            emb = next(m for m in model.modules() if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead))
            deferred = getattr(emb.cpu_linear, "__name__", "") == "first_use"
            x = torch.randn(3, emb.weight.shape[1], generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                lazy = emb.quant_method.apply(emb, x)  # builds the handler from the current weight, then uses it
                rebuilt_once = getattr(emb.cpu_linear, "__name__", "") != "first_use"
                dispatch_cpu_unquantized_gemm(emb, remove_weight=False)
                eager = emb.quant_method.apply(emb, x)
                plain = x @ emb.weight.T
            return deferred, rebuilt_once, torch.equal(lazy, eager), (lazy - plain).abs().max().item()

        return actor_self.engine.llm.apply_model(check)[0]

    sync_weights([trainer], [rollout])
    deferred, rebuilt_once, equal, gap = ray.get(rollout.__ray_call__.remote(_input_embedding_gemm))
    assert deferred and rebuilt_once
    assert equal  # bitwise the eager handler's output
    assert gap < 1e-4  # and it multiplies by the loaded weight


def test_tied_embedding_is_sent_once(actors):
    ray, trainer, _, _ = actors
    layout, _, _ = ray.get(trainer.gather_weights.remote())
    names = [s.name for s in layout.slots]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert layout.nbytes == sum(s.nbytes for s in layout.slots)  # one dtype: no gaps


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.5])
def test_C04_engine_and_trainer_agree_at_sampling_temperature(actors, temperature):
    ray, trainer, rollout, _ = actors
    prompt = [1, 4093, 198, 33, 3060, 314]
    ids, lps = ray.get(rollout.sample.remote(prompt, temperature, 12, 1234))
    assert len(ids) == len(lps) > 0
    row = TokenSequence(prompt + ids, [0] * len(prompt) + [1] * len(ids), lps,
                        [0.0] * (len(prompt) + len(ids)), "g", 0, "e")
    batch = TokenBatch.pack([row], SamplingRecord(temperature=temperature))
    trainer_lp = ray.get(trainer.compute_log_probs.remote(batch))[len(prompt):]
    gap = (trainer_lp - torch.tensor(lps)).abs().max().item()
    assert gap < TOL, f"T={temperature}: engine vs trainer gap {gap}"


# --- the collective path's process group alone (no engines): real actor processes, each with
# its own default group untouched; a member that never arrives is a ClusterError in time; the
# NCCL case runs only where two GPUs exist.

def _member_class(ray):
    @ray.remote(num_cpus=0.25)
    class Member:
        def __init__(self, with_default_group: bool = True) -> None:
            import torch.distributed as dist

            if with_default_group:  # stands for the trainer's FSDP group / vLLM's own group
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            self.sock = None
            self.group = None

        def endpoint(self) -> tuple[str, int]:
            import ray as _ray

            ip = _ray.util.get_node_ip_address()
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.bind((ip, 0))
            self.sock.listen(16)
            return ip, self.sock.getsockname()[1]

        def join(self, spec: GroupSpec, rank: int) -> None:
            import ray as _ray

            from agentrl.cluster.engines.weight_sync import WeightGroup

            self.group = WeightGroup(spec, rank, _ray.util.get_node_ip_address(), listen_sock=self.sock if rank == 0 else None)

        def broadcast(self, nbytes: int, seed: int) -> tuple[str, int, bool]:
            """Rank 0 sends a packed state; others receive it. Returns (checksum of the
            buffer's views, default group's world size, default group still usable)."""
            import torch.distributed as dist

            from agentrl.cluster.engines.weight_sync import FlatBuffer, FlatLayout

            g = torch.Generator().manual_seed(seed)
            state = {"a.weight": torch.randn(64, 32, generator=g), "b.weight": torch.randn(7, generator=g),
                     "c": torch.randn(5, generator=g).to(torch.bfloat16)}
            fb = FlatBuffer(self.group.device)
            if self.group.rank == 0:
                layout, buf = fb.pack(state)
            else:
                layout = FlatLayout.of(state)  # the layout travels beside the bytes
                buf = fb.get(layout.nbytes)
                buf.zero_()
            self.group.broadcast(buf)
            views = layout.views(buf)
            ok = all(torch.equal(views[k].cpu(), v) for k, v in state.items())
            if not dist.is_initialized():
                return ("ok" if ok else "mismatch"), 0, True
            probe = torch.ones(1)
            dist.all_reduce(probe)  # the default group still works, and is still alone
            return ("ok" if ok else "mismatch"), dist.get_world_size(), int(probe.item()) == 1

    return Member


def test_gloo_group_broadcasts_to_two_members_beside_their_default_groups(ray_session):
    ray = ray_session
    Member = _member_class(ray)
    members = [Member.remote() for _ in range(3)]  # trainer rank 0 + two engines
    host, port = ray.get(members[0].endpoint.remote())
    spec = GroupSpec("test-gloo", host, port, 3, "gloo", 60.0)
    ray.get([m.join.remote(spec, r) for r, m in enumerate(members)])
    out = ray.get([m.broadcast.remote(0, 7) for m in members])
    assert out == [("ok", 1, True)] * 3
    for m in members:
        ray.kill(m)


def test_missing_member_is_a_cluster_error_naming_the_address(ray_session):
    from ray.exceptions import RayTaskError

    ray = ray_session
    Member = _member_class(ray)
    first = Member.remote(with_default_group=False)
    host, port = ray.get(first.endpoint.remote())
    spec = GroupSpec("test-missing", host, port, 2, "gloo", 3.0)  # rank 1 never comes
    with pytest.raises(RayTaskError) as info:
        ray.get(first.join.remote(spec, 0), timeout=60)
    msg = str(info.value)
    assert "ClusterError" in msg and f"{host}:{port}" in msg and "within 3 s" in msg
    ray.kill(first)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="the NCCL path needs two GPUs (one per member)")
def test_nccl_group_broadcasts_between_two_gpus(ray_session):
    ray = ray_session
    Member = _member_class(ray)
    members = [Member.options(num_gpus=1).remote(with_default_group=False) for _ in range(2)]
    host, port = ray.get(members[0].endpoint.remote())
    spec = GroupSpec("test-nccl", host, port, 2, "nccl", 60.0)
    ray.get([m.join.remote(spec, r) for r, m in enumerate(members)])
    assert [o[0] for o in ray.get([m.broadcast.remote(0, 3) for m in members])] == ["ok", "ok"]
    for m in members:
        ray.kill(m)
