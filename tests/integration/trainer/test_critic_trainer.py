"""CriticTrainer with real parts: a tiny random Llama backbone, FSDP2 on a gloo group of one."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel

from agentrl.errors import CheckpointError, ConfigError, ContractError
from agentrl.trainer.config import CriticConfig
from agentrl.trainer.critic_trainer import CriticTrainer
from agentrl.trainer.losses import value_loss_terms
from agentrl.types import SamplingRecord, TokenBatch, TokenSequence, ValueBatch, ValueRow
from critics import turn_boundaries, turn_critic_advantages
from tests.helpers.trainer import critic_full_state_dict, full_grads, make_critic_batch

pytestmark = pytest.mark.usefixtures("process_group")

# hand-built 3-turn row: prompt 3, completion 2, observation 2, completion 3, observation 2, completion 1
PROMPTS, COMPLETIONS = [3, 2, 2], [2, 3, 1]
ROW = [11, 12, 13, 101, 102, 21, 22, 103, 104, 105, 31, 32, 106]


def _trainer(path: str, **kw) -> CriticTrainer:
    return CriticTrainer(CriticConfig(model_path=path, **{"lr": 1e-3, "head_init_std": 0.1, **kw}))


def _on_policy_rows(tb: TokenBatch, positions, returns=None, old_values=None) -> ValueBatch:
    """The value batch over the policy batch's own rows (same ids), one list per row."""
    return ValueBatch.pack([
        ValueRow(input_ids=tb.input_ids[s].tolist(), positions=positions[b],
                 returns=None if returns is None else returns[b],
                 old_values=None if old_values is None else old_values[b], episode_id=tb.episode_ids[b])
        for b, s in enumerate(tb.row_slices())
    ])


def _reference_values(model_path: str, head: dict[str, torch.Tensor], ids: list[int], positions: list[int]) -> torch.Tensor:
    """A plain HF base-model forward, hidden states at ``positions`` @ head; no trainer code."""
    backbone = AutoModel.from_pretrained(model_path, dtype=torch.float32)
    backbone.eval()
    with torch.no_grad():
        h = backbone(input_ids=torch.tensor([ids])).last_hidden_state[0]  # (L, H)
        return h[positions] @ head["head.weight"][0] + head["head.bias"][0]  # (K,)


def test_values_read_at_turn_boundaries_match_direct_hf_forward(tiny_llama_path: str) -> None:
    bounds = turn_boundaries(PROMPTS, COMPLETIONS)
    assert bounds == [2, 6, 11]
    trainer = _trainer(tiny_llama_path)
    other = [7, 8, 9, 10, 11, 12, 13, 14, 15]
    batch = ValueBatch.pack(
        [
            ValueRow(input_ids=ROW, positions=bounds, episode_id="a"),
            ValueRow(input_ids=other, positions=[0, 4], episode_id="b"),
        ]
    )
    values = trainer.compute_values(batch)
    assert values.shape == (5,) and values.dtype == torch.float32
    sd = critic_full_state_dict(trainer)
    want_a = _reference_values(tiny_llama_path, sd, ROW, bounds)
    want_b = _reference_values(tiny_llama_path, sd, other, [0, 4])
    torch.testing.assert_close(values[:3], want_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(values[3:], want_b, atol=1e-5, rtol=0)
    assert values.abs().min() > 1e-4  # a non-zero head, so the check means something
    # The value of turn k reads only s_k: changing turn 0's completion tokens (3, 4) leaves
    # V(s_0) alone and changes V(s_1), V(s_2); changing the last completion changes nothing.
    row2 = list(ROW)
    row2[3:5] = [200, 201]
    row3 = list(ROW)
    row3[12] = 250
    v2 = trainer.compute_values(ValueBatch.pack([ValueRow(input_ids=row2, positions=bounds)]))
    v3 = trainer.compute_values(ValueBatch.pack([ValueRow(input_ids=row3, positions=bounds)]))
    assert float(v2[0]) == pytest.approx(float(values[0]), abs=1e-6)
    assert (v2[1:] - values[1:3]).abs().min() > 1e-5
    torch.testing.assert_close(v3, values[:3], atol=1e-6, rtol=0)


def test_zero_initialised_head_predicts_zero_and_backbone_gets_no_first_gradient(tiny_llama_path: str) -> None:
    trainer = _trainer(tiny_llama_path, head_init_std=0.0)
    batch = make_critic_batch(num_rows=3, seed=1)
    assert torch.equal(trainer.compute_values(batch), torch.zeros(batch.num_positions))
    trainer.step(batch)
    grads = full_grads(trainer)
    assert grads["head.bias"].abs().sum() > 0 and grads["head.weight"].abs().sum() > 0
    assert all(float(g.abs().max()) == 0.0 for k, g in grads.items() if k.startswith("backbone."))
    assert trainer.compute_values(batch).abs().max() > 0  # the head moved


def test_value_loss_terms_known_numbers() -> None:
    v = torch.tensor([1.0, 0.0, 2.0])
    r = torch.tensor([0.5, 1.0, 2.0])
    old = torch.tensor([0.0, 0.0, 1.0])
    loss, clipped = value_loss_terms(v, r, None, None)
    torch.testing.assert_close(loss, torch.tensor([0.125, 0.5, 0.0]))
    assert clipped.sum() == 0
    # clipped V: old + clip(v - old, +-0.2) = [0.2, 0.0, 1.2]; (V_c - R)^2 = [0.09, 1.0, 0.64]
    loss, clipped = value_loss_terms(v, r, old, 0.2)
    torch.testing.assert_close(loss, torch.tensor([0.125, 0.5, 0.32]))
    torch.testing.assert_close(clipped, torch.tensor([0.0, 0.0, 1.0]))
    with pytest.raises(ContractError, match="old_values is None"):
        value_loss_terms(v, r, None, 0.2)


@pytest.mark.parametrize("value_clip", [None, 0.2])
def test_step_reports_the_loss_of_the_current_values(tiny_llama_path: str, value_clip: float | None) -> None:
    trainer = _trainer(tiny_llama_path, value_clip=value_clip, micro_batch_size=2)
    batch = make_critic_batch(num_rows=5, seed=3, with_old_values=True)
    v = trainer.compute_values(batch).double()
    r, old = batch.returns.double(), batch.old_values.double()
    unclipped = (v - r) ** 2
    if value_clip is None:
        want, want_frac = 0.5 * unclipped.mean(), 0.0
    else:
        c = (old + (v - old).clamp(-value_clip, value_clip) - r) ** 2
        want, want_frac = 0.5 * torch.maximum(unclipped, c).mean(), float((c > unclipped).double().mean())
        assert 0.0 < want_frac < 1.0  # some turns clipped, some not
    m = trainer.step(batch)
    assert m["losses/value_loss"] == pytest.approx(float(want), abs=1e-6)
    assert m["losses/value_clipfrac"] == pytest.approx(want_frac, abs=1e-9)
    assert m["critic/values_mean"] == pytest.approx(float(v.mean()), abs=1e-6)
    assert m["critic/returns_mean"] == pytest.approx(float(r.mean()), abs=1e-6)
    ev = 1 - float((r - v).var(unbiased=False) / r.var(unbiased=False))
    assert m["critic/explained_variance"] == pytest.approx(ev, abs=1e-6)
    assert m["train/num_value_positions"] == batch.num_positions
    assert m["train/global_step"] == 1.0 and m["train/grad_norm"] > 0


def test_short_training_run_fits_fixed_targets(tiny_llama_path: str) -> None:
    trainer = _trainer(tiny_llama_path, lr=3e-3, head_init_std=0.0, micro_batch_size=3)
    batch = make_critic_batch(num_rows=6, seed=5)
    losses = [trainer.step(batch)["losses/value_loss"] for _ in range(25)]
    assert losses[-1] < 0.2 * losses[0], losses
    assert min(losses[-5:]) < min(losses[:5])
    final = trainer.compute_values(batch)
    assert float(0.5 * ((final - batch.returns) ** 2).mean()) < 0.2 * losses[0]


def test_checkpoint_round_trip_resumes_bit_identically(tiny_llama_path: str, tmp_path) -> None:
    batch_a = make_critic_batch(num_rows=4, seed=8, with_old_values=True)
    batch_b = make_critic_batch(num_rows=4, seed=9, with_old_values=True)
    cfg = {"value_clip": 0.3, "warmup_steps": 3, "epochs": 2, "micro_batch_size": 3}
    a = _trainer(tiny_llama_path, **cfg)
    a.step(batch_a)
    a.save_checkpoint(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="already holds a checkpoint"):
        a.save_checkpoint(tmp_path / "ckpt")
    after_a = [a.step(batch_b), a.step(batch_a)]
    torch_draw_a = torch.rand(3)

    b = _trainer(tiny_llama_path, seed=123, **cfg)  # different seed: everything must come from the checkpoint
    b.load_checkpoint(tmp_path / "ckpt")
    assert b.global_step == 1
    after_b = [b.step(batch_b), b.step(batch_a)]
    assert torch.equal(torch.rand(3), torch_draw_a)
    for ma, mb in zip(after_a, after_b):
        for k in ma:
            if not k.startswith("perf/"):
                assert ma[k] == mb[k], k
    wa, wb = critic_full_state_dict(a), critic_full_state_dict(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert torch.equal(a.compute_values(batch_a), b.compute_values(batch_a))
    with pytest.raises(CheckpointError, match="not a complete trainer checkpoint"):
        b.load_checkpoint(tmp_path / "nothing")


def test_value_rows_over_the_policy_rows_feed_turn_gae(tiny_llama_path: str) -> None:
    mask = [0] * 3 + [1] * 2 + [0] * 2 + [1] * 3 + [0] * 2 + [1] * 1
    seq = TokenSequence(
        input_ids=ROW, loss_mask=mask, behavior_log_probs=[-1.0] * 6, advantages=[0.0] * 13,
        group_id="g", policy_version=0, episode_id="ep",
    )
    tb = TokenBatch.pack([seq, seq], SamplingRecord())
    bounds = turn_boundaries(PROMPTS, COMPLETIONS)
    trainer = _trainer(tiny_llama_path)
    values = trainer.compute_values(_on_policy_rows(tb, [bounds, bounds]))
    direct = trainer.compute_values(ValueBatch.pack([ValueRow(input_ids=ROW, positions=bounds)]))
    torch.testing.assert_close(values[:3], direct, atol=1e-6, rtol=0)
    torch.testing.assert_close(values[3:], direct, atol=1e-6, rtol=0)
    per_ep = [values[s].tolist() for s in _on_policy_rows(tb, [bounds, bounds]).position_slices()]
    adv, ret = turn_critic_advantages([[0.0, 0.0, 1.0]] * 2, per_ep, gamma=1.0, lam=0.95)
    train = _on_policy_rows(tb, [bounds, bounds], [r.tolist() for r in ret], per_ep)
    m = trainer.step(train)
    assert m["train/num_value_positions"] == 6
    assert m["critic/values_mean"] == pytest.approx(float(values.mean()), abs=1e-6)


def test_bad_input_raises_clear_errors(tiny_llama_path: str) -> None:
    with pytest.raises(ContractError, match=r"position 13 outside the row's tokens \[0, 13\)"):
        ValueBatch.pack([ValueRow(input_ids=ROW, positions=[2, 13], returns=[0.0, 0.0])])
    with pytest.raises(ContractError, match="1 returns for 2 positions"):
        ValueBatch.pack([ValueRow(input_ids=ROW, positions=[2, 6], returns=[0.0])])
    with pytest.raises(ContractError, match="not all finite"):
        ValueBatch.pack([ValueRow(input_ids=ROW, positions=[2], returns=[float("nan")])])
    with pytest.raises(ContractError, match="either every row carries old_values or none"):
        ValueBatch.pack(
            [ValueRow(input_ids=ROW, positions=[2], returns=[0.0], old_values=[0.0]),
             ValueRow(input_ids=ROW, positions=[2], returns=[0.0])]
        )
    with pytest.raises(ContractError, match="no rows"):
        ValueBatch.pack([])
    with pytest.raises(ConfigError, match="value_clip=-0.1"):
        CriticConfig(model_path=tiny_llama_path, value_clip=-0.1).validate()
    with pytest.raises(ConfigError, match="epochs=0"):
        CriticConfig(model_path=tiny_llama_path, epochs=0).validate()
    with pytest.raises(ConfigError, match="not a Hugging Face model folder"):
        CriticTrainer(CriticConfig(model_path="/nonexistent/model"))
    trainer = _trainer(tiny_llama_path)
    with pytest.raises(ContractError, match="token id 999 outside the model's vocabulary"):
        trainer.compute_values(ValueBatch.pack([ValueRow(input_ids=[1, 999], positions=[0])]))
    with pytest.raises(ContractError, match="no returns"):
        trainer.step(ValueBatch.pack([ValueRow(input_ids=ROW, positions=[2])]))
    with pytest.raises(ContractError, match="no value positions"):
        trainer.step(ValueBatch.pack([ValueRow(input_ids=ROW, positions=[], returns=[])]))


def test_rows_without_turns_change_nothing(tiny_llama_path: str) -> None:
    rows = [
        ValueRow(input_ids=ROW, positions=[2, 6, 11], returns=[0.5, -1.0, 2.0]),
        ValueRow(input_ids=[5, 6, 7, 8], positions=[], returns=[]),  # e.g. a row with no turn left
        ValueRow(input_ids=[9, 10, 11], positions=[1], returns=[1.5]),
    ]
    with_empty = _trainer(tiny_llama_path, micro_batch_size=1)
    without = _trainer(tiny_llama_path, micro_batch_size=1)
    m1 = with_empty.step(ValueBatch.pack(rows))
    m2 = without.step(ValueBatch.pack([rows[0], rows[2]]))
    assert m1["losses/value_loss"] == pytest.approx(m2["losses/value_loss"], abs=1e-7)
    g1, g2 = full_grads(with_empty), full_grads(without)
    for k in g2:
        torch.testing.assert_close(g1[k], g2[k], atol=1e-7, rtol=0, msg=k)


def _episode(mode: str, episode_id: str):
    from agentrl.types import Episode, Turn

    turns = [
        Turn(prompt_ids=[11, 12, 13], completion_ids=[101, 102], behavior_log_probs=[-0.1, -0.2], reward=0.0),
        Turn(prompt_ids=[21, 22], completion_ids=[103, 104, 105], behavior_log_probs=[-0.1] * 3, reward=0.0),
        Turn(prompt_ids=[31, 32], completion_ids=[106], behavior_log_probs=[-0.3], reward=1.0),
    ]
    return Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, prompt_mode=mode, episode_id=episode_id)


def test_episode_wiring_in_both_prompt_modes(tiny_llama_path: str) -> None:
    """What the controller does: rows as ``Episode.training_sequences`` lays them out,
    boundaries from ``agentrl.credit.episode_boundaries``, values → ``turn_critic_advantages`` →
    returns (and old values) split back per row → ``step``."""
    from agentrl.credit import episode_boundaries, split_per_row

    trainer = _trainer(tiny_llama_path, value_clip=0.5)
    episodes = [_episode("full_history", "a"), _episode("per_step", "b")]
    seqs = [row for e in episodes for row in e.training_sequences([0.0] * len(e.turns))]
    tb = TokenBatch.pack(seqs, SamplingRecord())
    bounds = [b for e in episodes for b in episode_boundaries(e)]
    assert tb.num_rows == len(bounds) == 4
    values = trainer.compute_values(_on_policy_rows(tb, bounds))  # (6,)
    per_ep = list(torch.split(values, [len(e.turns) for e in episodes]))
    # turn 0 reads the same context (the first prompt) in both modes
    assert float(per_ep[0][0]) == pytest.approx(float(per_ep[1][0]), abs=1e-6)
    # full-history turn 1 reads the whole history, per-step turn 1 its own prompt only
    assert abs(float(per_ep[0][1]) - float(per_ep[1][1])) > 1e-5
    _, returns = turn_critic_advantages(
        [[t.reward for t in e.turns] for e in episodes], per_ep, gamma=0.99, lam=0.95
    )
    ret_rows = [r for e, ret in zip(episodes, returns) for r in split_per_row(e, ret)]
    old_rows = [r for e, v in zip(episodes, per_ep) for r in split_per_row(e, v)]
    batch = _on_policy_rows(tb, bounds, ret_rows, old_rows)
    m = trainer.step(batch)
    want = 0.5 * float(((values.double() - batch.returns.double()) ** 2).mean())  # V == V_old: no clipping yet
    assert m["losses/value_loss"] == pytest.approx(want, abs=1e-6)
    assert m["losses/value_clipfrac"] == 0.0


def test_checkpoint_missing_backbone_weights_is_refused(tiny_llama_path: str, tmp_path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_path, broken)
    (weights,) = broken.glob("*.safetensors")
    sd = load_file(weights)
    del sd["model.norm.weight"]
    save_file(sd, weights, metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="randomly initialised or mismatched weight"):
        CriticTrainer(CriticConfig(model_path=str(broken)))


def test_token_level_values_are_read_before_each_sampled_token(tiny_llama_path: str) -> None:
    """gae's critic: the value of sampled token p is the head on the hidden state at p - 1
    (verl's ``values[:, -resp_len-1:-1]``), so it depends on the prefix and not on p itself."""
    import critics

    mask = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1]  # ROW's layout: PPP CC OO CCC OO C
    pos = critics.token_value_positions(mask)
    assert pos == [2, 3, 6, 7, 8, 11]
    trainer = _trainer(tiny_llama_path)
    values = trainer.compute_values(ValueBatch.pack([ValueRow(input_ids=ROW, positions=pos)]))  # (6,)
    want = _reference_values(tiny_llama_path, critic_full_state_dict(trainer), ROW, pos)
    torch.testing.assert_close(values, want, atol=1e-5, rtol=0)
    # changing the sampled token at 4 leaves its own value (read at 3) and the ones before
    # alone and changes every later one
    row2 = list(ROW)
    row2[4] = 222
    v2 = trainer.compute_values(ValueBatch.pack([ValueRow(input_ids=row2, positions=pos)]))
    torch.testing.assert_close(v2[:2], values[:2], atol=1e-6, rtol=0)
    assert (v2[2:] - values[2:]).abs().min() > 1e-5


def test_token_level_episode_wiring_in_both_prompt_modes(tiny_llama_path: str) -> None:
    """What the controller does for gae: critic rows with a value position per sampled
    token, values split per episode by its sampled-token count → token_critic_advantages →
    returns and old values split back per row → step. The loss is a mean over tokens."""
    import critics
    from agentrl.credit import critic_rows

    trainer = _trainer(tiny_llama_path, value_clip=0.5)
    episodes = [_episode("full_history", "a"), _episode("per_step", "b")]
    values = trainer.compute_values(ValueBatch.pack(critic_rows(episodes, level="token")))
    n_tokens = [e.num_generated_tokens() for e in episodes]
    assert values.shape == (sum(n_tokens),) == (12,)
    per_ep = list(torch.split(values, n_tokens))
    # turn 0's tokens read the same prefix in both modes; per-step turn 1 sees only its own prompt
    torch.testing.assert_close(per_ep[0][:2], per_ep[1][:2], atol=1e-6, rtol=0)
    assert abs(float(per_ep[0][2]) - float(per_ep[1][2])) > 1e-5
    rewards = [[t.reward for t in e.turns] for e in episodes]
    counts = [[len(t.completion_ids) for t in e.turns] for e in episodes]
    adv, returns = critics.token_critic_advantages(counts, rewards, per_ep, gamma=1.0, lam=0.95)
    assert all(a.shape == (n,) for a, n in zip(adv, n_tokens))
    batch = ValueBatch.pack(critic_rows(episodes, returns=returns, old_values=per_ep, level="token"))
    m = trainer.step(batch)
    assert m["train/num_value_positions"] == 12  # one value per sampled token
    want = 0.5 * float(((values.double() - batch.returns.double()) ** 2).mean())  # token-mean, no clipping yet
    assert m["losses/value_loss"] == pytest.approx(want, abs=1e-6)
    assert m["losses/value_clipfrac"] == 0.0 and torch.isfinite(torch.tensor(m["critic/explained_variance"]))
