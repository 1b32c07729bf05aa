"""``assign_credit``: the estimator looked up by name (built-in or a user's), its level's
signature, shaping once per episode, the critic's values through ``values_fn``, the refill
count, and ``algorithm.advantage`` validated against the registry."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import critics
from agentrl.config import AlgorithmConfig, load_config
from agentrl.credit import assign_credit, missing_groups
from agentrl.credit import assign as assign_mod
from agentrl.errors import ConfigError, ContractError
from agentrl.replay.trainer_values import turn_trainer_values
from agentrl.types import Episode, SamplingRecord, TerminationReason, Turn


def _ep(group, rewards, *, anchors=None, episode_id=None, mode="full_history", lens=None):
    ep = Episode(group_id=group, env_id="e", task_id=group, seed=0, prompt_mode=mode,
                 termination_reason=TerminationReason.ENV_TERMINATED, terminated=True)
    if episode_id:
        ep.episode_id = episode_id
    for k, r in enumerate(rewards):
        n = (lens or [2] * len(rewards))[k]
        ep.turns.append(Turn(prompt_ids=[1, 2], completion_ids=[5] * n, behavior_log_probs=[-0.5] * n, reward=r,
                             anchor=(anchors or [f"s{k}"] * len(rewards))[k]))
    return ep


def test_grpo_known_values_through_assign_credit():
    # group a: returns 1, 0 -> mean 0.5, std (ddof 1) 0.7071 -> +-0.7071; group b: equal -> 0
    eps = [_ep("a", [1.0], episode_id="a1"), _ep("a", [0.0], episode_id="a0"),
           _ep("b", [0.5], episode_id="b1"), _ep("b", [0.5], episode_id="b2")]
    res = assign_credit(eps, AlgorithmConfig(), SamplingRecord())
    s = 0.5 / (np.sqrt(0.5) + 1e-6)
    assert res.turn_advantages["a1"] == pytest.approx([s], abs=1e-12)
    assert res.turn_advantages["a0"] == pytest.approx([-s], abs=1e-12)
    assert res.turn_advantages["b1"] == [0.0] and res.turn_advantages["b2"] == [0.0]
    assert res.value_batch is None and "critic/values_mean_rollout" not in res.metrics
    assert res.metrics["advantages/nonzero_frac"] == 0.5


def test_gigpo_through_assign_credit_equals_the_estimator_on_shaped_rewards():
    eps = [_ep("g", [0.0, 1.0], anchors=["x", "y"]), _ep("g", [0.0, 0.0], anchors=["x", "z"])]
    cfg = AlgorithmConfig(advantage="gigpo", gamma=0.9)
    res = assign_credit(eps, cfg, SamplingRecord())
    want = critics.gigpo_advantages([[0.0, 1.0], [0.0, 0.0]], [["x", "y"], ["x", "z"]], ["g", "g"], gamma=0.9)
    for e, w in zip(eps, want):
        assert res.turn_advantages[e.episode_id] == pytest.approx(list(w), abs=1e-12)


def test_turn_critic_reads_values_at_turn_boundaries_and_returns_the_critic_batch():
    ep = _ep("g", [0.0, 1.0], episode_id="t")  # stream PP CC PP CC: boundaries 1 and 5
    cfg = AlgorithmConfig(advantage="turn_critic", gamma=0.9, lam=0.8)
    seen = []

    def values_fn(vb):
        seen.append(vb.positions.tolist())
        return [0.25, 0.5]

    res = assign_credit([ep], cfg, SamplingRecord(), values_fn=values_fn)
    assert seen == [[1, 5]]
    adv, ret = critics.turn_critic_advantages([[0.0, 1.0]], [[0.25, 0.5]], gamma=0.9, lam=0.8)
    assert res.turn_advantages["t"] == pytest.approx(list(adv[0]), abs=1e-12)
    np.testing.assert_allclose(res.value_batch.returns.double().numpy(), ret[0], atol=1e-6)
    np.testing.assert_allclose(res.value_batch.old_values.double().numpy(), [0.25, 0.5], atol=1e-6)
    assert res.metrics["critic/values_mean_rollout"] == pytest.approx(0.375)


def test_a_registered_turn_estimator_is_called_with_its_signature(registered):
    calls = []

    def mean_baseline(rewards, anchors, group_ids, values, params):
        calls.append((rewards, anchors, group_ids, values, params))
        mean = float(np.mean([sum(r) for r in rewards]))
        return [[sum(r) - mean] * len(r) for r in rewards]

    registered("test_mean_baseline", mean_baseline)
    eps = [_ep("a", [1.0, 0.5], anchors=["p", "q"], episode_id="x", mode="per_step"), _ep("b", [0.0], episode_id="y")]
    cfg = AlgorithmConfig(advantage="test_mean_baseline", gamma=0.5, invalid_action_penalty=0.0)
    res = assign_credit(eps, cfg, SamplingRecord())
    (rewards, anchors, group_ids, values, params), = calls
    assert rewards == [[1.0, 0.5], [0.0]] and anchors == [["p", "q"], ["s0"]] and group_ids == ["a", "b"]
    assert values is None and params.gamma == 0.5 and isinstance(params, critics.EstimatorParams)
    assert res.turn_advantages == {"x": [0.75, 0.75], "y": [-0.75]}
    assert res.batch.num_rows == 3  # per_step: one row per step
    assert res.batch.advantages.tolist() == [0, 0, 0.75, 0.75] * 2 + [0, 0, -0.75, -0.75]


def test_a_registered_token_estimator_gets_turn_token_counts(registered):
    def ramp(rewards, anchors, group_ids, values, turn_token_counts, params):
        return [np.arange(sum(c), dtype=float) for c in turn_token_counts]

    registered("test_ramp", ramp, level="token")
    ep = _ep("a", [1.0, 0.0], lens=[2, 3], episode_id="r")
    res = assign_credit([ep], AlgorithmConfig(advantage="test_ramp"), SamplingRecord())
    assert res.batch.advantages.tolist() == [0, 0, 0, 1, 0, 0, 2, 3, 4]
    assert res.turn_advantages["r"] == [0.5, 3.0]  # mean per turn for the replay store


def test_an_estimator_returning_wrong_counts_is_a_contract_error(registered):
    registered("test_short", lambda rewards, anchors, group_ids, values, params: [[0.0]] * len(rewards))
    with pytest.raises(ContractError, match="estimator 'test_short' returned 1 advantages for episode e2; expected 2"):
        assign_credit([_ep("a", [1.0, 0.0], episode_id="e2")], AlgorithmConfig(advantage="test_short"), SamplingRecord())


def test_shaped_rewards_are_computed_once_per_episode(monkeypatch):
    calls = []
    real = assign_mod.shaped_turn_rewards

    def counting(e, cfg, max_new_tokens=None):
        calls.append(e.episode_id)
        return real(e, cfg, max_new_tokens)

    monkeypatch.setattr(assign_mod, "shaped_turn_rewards", counting)
    eps = [_ep("a", [1.0]), _ep("a", [0.0]), _ep("b", [1.0]), _ep("b", [1.0])]
    cfg = AlgorithmConfig(dynamic_sampling=True, invalid_action_penalty=0.5, overlong_buffer_tokens=1)
    res = assign_credit(eps, cfg, SamplingRecord(), max_new_tokens=8)
    assert sorted(calls) == sorted(e.episode_id for e in eps)  # once each, though filtered, shaped and scored
    assert res.metrics["filter/dynamic_sampling_dropped_groups"] == 1
    assert res.metrics["shaping/reward_delta_sum"] == 0.0


def test_missing_groups_counts_what_dynamic_sampling_dropped():
    eps = [_ep("a", [1.0]), _ep("a", [0.0]), _ep("b", [1.0]), _ep("b", [1.0])]
    assert missing_groups(eps, AlgorithmConfig(dynamic_sampling=True), groups_wanted=2) == 1
    assert missing_groups(eps, AlgorithmConfig(dynamic_sampling=True), groups_wanted=1) == 0
    assert missing_groups(eps, AlgorithmConfig(), groups_wanted=5) == 0  # no dynamic sampling: no refill


def test_advantage_is_validated_against_the_registry(registered):
    with pytest.raises(ConfigError, match=r"algorithm.advantage='gigpoo'.*did you mean 'gigpo'.*'turn_critic'"):
        load_config(None, ["algorithm.advantage=gigpoo"])
    registered("test_needs_values", lambda *a: None, needs_values=True)
    cfg = load_config(None, ["algorithm.advantage=test_needs_values"])
    assert cfg.algorithm.uses_critic  # from the registration
    assert not load_config(None, ["algorithm.advantage=rloo"]).algorithm.uses_critic


def test_import_modules_register_an_estimator_before_the_config_validates(tmp_path, monkeypatch):
    (tmp_path / "test_user_estimators.py").write_text(
        "import critics\n"
        "critics.register_estimator('test_from_module', lambda r, a, g, v, p: [[0.0] * len(x) for x in r])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = load_config(None, ["env.import_modules=[test_user_estimators]", "algorithm.advantage=test_from_module"])
        res = assign_credit([_ep("a", [1.0])], cfg.algorithm, SamplingRecord())
        assert res.batch.num_loss_tokens == 2
        with pytest.raises(ConfigError, match="env.import_modules: module 'no_such_mod_xyz' could not be imported"):
            load_config(None, ["env.import_modules=[no_such_mod_xyz]"])
    finally:
        critics.ESTIMATORS.pop("test_from_module", None)
        sys.modules.pop("test_user_estimators", None)


# ----------------------------------------------------- an estimator breaking its contract


def test_registration_checks_the_signature_against_the_level(registered):
    with pytest.raises(ConfigError, match=r"estimator 'test_tok_sig' \(level='turn'\) has signature "
                                          r"test_tok_sig\(rewards, anchors, group_ids, values, tc, params\).*"
                                          r"fn\(rewards, anchors, group_ids, values, params\)"):
        registered("test_tok_sig", lambda rewards, anchors, group_ids, values, tc, params: rewards)
    with pytest.raises(ConfigError, match=r"'test_turn_sig' \(level='token'\).*"
                                          r"fn\(rewards, anchors, group_ids, values, turn_token_counts, params\)"):
        registered("test_turn_sig", lambda r, a, g, v, p: r, level="token")
    with pytest.raises(ConfigError, match=r"'test_noargs' \(level='turn'\) has signature test_noargs\(\)"):
        registered("test_noargs", lambda: None)
    assert not {"test_tok_sig", "test_turn_sig", "test_noargs"} & set(critics.ESTIMATORS)
    registered("test_star", lambda *a, **kw: None)  # *args takes either level's arguments
    registered("test_star_tok", lambda *a: None, level="token")
    registered("test_defaults", lambda r, a, g, v, p, extra=None: None)


@pytest.mark.parametrize("ret, match", [
    (0.5, r"estimator 'test_bad' returned advantages as float 0.5; expected one sequence per episode \(2"),
    (None, r"returned advantages as NoneType None; expected one sequence per episode"),
    ([1.0, 1.0], r"returned float 1.0 as advantages for episode e0; expected a sequence of 2 numbers "
                 r"\(one per turn; episode index 0, level='turn'\)"),
    ([[0.0, 0.0]], r"returned advantages for 1 episodes; expected 2"),
    ([[0.0, 0.0], [0.0]], r"returned 1 advantages for episode e1; expected 2 \(one per turn; episode index 1"),
    ([[0.0, 0.0], [0.0, float("nan")]], r"returned nan as advantages at turn 1 of episode e1; expected finite"),
    ([[0.0, 0.0], ["a", "b"]], r"dtype <U1 as advantages for episode e1; expected 2 real numbers"),
    ([[0.0, 0.0], [[0.0, 0.0], [0.0, 0.0]]], r"shape \(2, 2\).*for episode e1"),
])
def test_a_malformed_return_is_a_contract_error_naming_estimator_and_episode(registered, ret, match):
    registered("test_bad", lambda r, a, g, v, p: ret)
    eps = [_ep("a", [1.0, 0.0], episode_id="e0"), _ep("a", [0.0, 0.0], episode_id="e1")]
    with pytest.raises(ContractError, match=match):
        assign_credit(eps, AlgorithmConfig(advantage="test_bad"), SamplingRecord())


def test_a_token_estimator_must_return_one_number_per_sampled_token(registered):
    registered("test_tok_short", lambda r, a, g, v, c, p: [[0.0] * len(x) for x in r], level="token")
    with pytest.raises(ContractError, match=r"'test_tok_short' returned 2 advantages for episode t0; expected 5 "
                                            r"\(one per sampled token; episode index 0, level='token'\)"):
        assign_credit([_ep("a", [1.0, 0.0], episode_id="t0", lens=[2, 3])],
                      AlgorithmConfig(advantage="test_tok_short"), SamplingRecord())


def test_a_needs_values_estimator_must_return_an_advantages_returns_pair(registered):
    # two episodes of two turns: the bare advantages list would unpack into two "halves"
    registered("test_no_pair", lambda r, a, g, v, p: [[0.0] * len(x) for x in r], needs_values=True)
    eps = [_ep("a", [1.0, 0.0], episode_id="p0"), _ep("a", [0.0, 0.0], episode_id="p1")]
    with pytest.raises(ContractError, match=r"estimator 'test_no_pair' \(level='turn', needs_values=True\) "
                                            r"returned list of length 2; expected a 2-tuple \(advantages, returns\)"):
        assign_credit(eps, AlgorithmConfig(advantage="test_no_pair"), SamplingRecord(),
                      values_fn=lambda vb: [0.0] * vb.num_positions)
    registered("test_bad_returns", lambda r, a, g, v, p: ([[0.0] * len(x) for x in r], [[0.0]] * len(r)),
               needs_values=True)
    with pytest.raises(ContractError, match=r"'test_bad_returns' returned 1 returns for episode p0; expected 2"):
        assign_credit(eps, AlgorithmConfig(advantage="test_bad_returns"), SamplingRecord(),
                      values_fn=lambda vb: [0.0] * vb.num_positions)


def test_shaping_runs_once_per_episode_across_refill_checks_and_credit(monkeypatch):
    calls = []
    real = assign_mod.shaped_turn_rewards

    def counting(e, cfg, max_new_tokens=None):
        calls.append(e.episode_id)
        return real(e, cfg, max_new_tokens)

    cfg = AlgorithmConfig(dynamic_sampling=True, invalid_action_penalty=0.5, overlong_buffer_tokens=1)
    first = [_ep("a", [1.0], episode_id="a1"), _ep("a", [0.0], episode_id="a0"),
             _ep("b", [1.0], episode_id="b1"), _ep("b", [1.0], episode_id="b2")]
    refill = [_ep("c", [1.0], episode_id="c1"), _ep("c", [1.0], episode_id="c2")]  # dropped again
    refill2 = [_ep("d", [1.0], episode_id="d1"), _ep("d", [0.0], episode_id="d0")]
    expected = assign_credit(first + refill + refill2, cfg, SamplingRecord(), max_new_tokens=8)  # no cache
    monkeypatch.setattr(assign_mod, "shaped_turn_rewards", counting)
    cache: dict = {}  # what the controller's refill loop does, one per iteration
    episodes = first
    for more in (refill, refill2):
        assert missing_groups(episodes, cfg, groups_wanted=2, max_new_tokens=8, shaped_cache=cache) == 1
        episodes = episodes + more
    assert missing_groups(episodes, cfg, groups_wanted=2, max_new_tokens=8, shaped_cache=cache) == 0
    res = assign_credit(episodes, cfg, SamplingRecord(), max_new_tokens=8, shaped_cache=cache)
    assert sorted(calls) == sorted(e.episode_id for e in episodes)  # 8 calls for 8 episodes, 3 checks + credit
    assert res.turn_advantages == expected.turn_advantages and res.metrics == expected.metrics


def _cut(ep, last_len=3):
    """``ep`` ended by its last completion hitting max_new_tokens, with that completion
    ``last_len`` tokens of id 7 and log-prob -0.25 (the other turns keep id 5, -0.5)."""
    ep.termination_reason, ep.terminated, ep.truncated = TerminationReason.LENGTH, False, True
    t = ep.turns[-1]
    ep.turns[-1] = Turn(prompt_ids=t.prompt_ids, completion_ids=[7] * last_len, behavior_log_probs=[-0.25] * last_len,
                        reward=t.reward, anchor=t.anchor, finish_reason="length")
    return ep


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_overlong_filtering_keeps_the_cut_turn_out_of_the_loss_but_in_the_group_statistics(mode):
    # group g: the cut episode's return 1 vs 0 -> +-0.7071; filtering must not change that
    eps = [_cut(_ep("g", [0.0, 1.0], episode_id="cut", mode=mode)), _ep("g", [0.0, 0.0], episode_id="ok", mode=mode)]
    plain = assign_credit(eps, AlgorithmConfig(), SamplingRecord())
    res = assign_credit(eps, AlgorithmConfig(overlong_filtering=True), SamplingRecord())
    s = 0.5 / (np.sqrt(0.5) + 1e-6)
    assert plain.turn_advantages["cut"] == pytest.approx([s, s], abs=1e-12)
    # the cut turn trained nothing: the store and viewer get None for it, the other turns as without filtering
    assert res.turn_advantages["cut"][0] == pytest.approx(s, abs=1e-12) and res.turn_advantages["cut"][1] is None
    assert res.turn_advantages["ok"] == plain.turn_advantages["ok"]
    b = res.batch
    ids, mask = b.input_ids.tolist(), b.loss_mask.tolist()
    assert all(m == 0.0 for i, m in zip(ids, mask) if i == 7)  # the cut completion is never in the loss
    # full_history keeps the row whole (its layout still describes it); per_step drops the cut turn's row
    assert b.num_tokens == plain.batch.num_tokens - (5 if mode == "per_step" else 0)
    got = turn_trainer_values(eps, b.episode_ids, b.seq_lens.tolist(), np.zeros(b.num_tokens), np.zeros(b.num_tokens))
    assert [v is None for v in got["cut"]] == [False, mode == "per_step"]
    assert sorted(set(b.behavior_log_probs[b.loss_mask > 0].tolist())) == [-0.5]
    assert b.num_loss_tokens == plain.batch.num_loss_tokens - 3 == 3 * 2  # the cut's first turn + ok's two turns
    assert res.metrics["filter/overlong_filtered_turns"] == 1.0
    assert res.metrics["tokens/discarded"] == plain.metrics["tokens/discarded"] + 3
    assert res.metrics["tokens/trained"] == 6.0


def test_overlong_filtering_drops_a_per_step_row_with_nothing_left_and_an_all_cut_batch_is_empty():
    one = _cut(_ep("g", [1.0], episode_id="cut", mode="per_step"))
    other = _ep("g", [0.0], episode_id="ok", mode="per_step")
    res = assign_credit([one, other], AlgorithmConfig(overlong_filtering=True), SamplingRecord())
    assert res.batch.episode_ids == ("ok:0",) and res.batch.num_rows == 1
    only_cut = assign_credit([one, _cut(_ep("g", [0.0], episode_id="cut2", mode="per_step"))],
                             AlgorithmConfig(overlong_filtering=True), SamplingRecord())
    assert only_cut.batch is None and only_cut.metrics["tokens/trained"] == 0.0
    assert set(only_cut.turn_advantages) == {"cut", "cut2"}
