"""Per-token policy versions in the data contract (agentrl/types/): ``Turn.policy_versions``
(one per completion id, never decreasing, the first is ``policy_version``),
``Episode.policy_version_range``, and the rows: ``TokenSequence.policy_version`` /
``TokenBatch.policy_versions`` are a row's OLDEST token version, ``token_policy_versions``
``[T]`` carries each token's (0 off the loss tokens)."""

from __future__ import annotations

import pytest
import torch

from agentrl.errors import ContractError
from agentrl.types import Episode, SamplingRecord, TokenBatch, TokenSequence, Turn


def turn(n_prompt: int, versions: list[int]) -> Turn:
    return Turn(prompt_ids=list(range(1, n_prompt + 1)), completion_ids=[7] * len(versions),
                behavior_log_probs=[-0.5] * len(versions), policy_version=versions[0] if versions else 0,
                policy_versions=list(versions))


def test_a_turn_built_by_hand_gets_its_version_on_every_token():
    t = Turn(prompt_ids=[1], completion_ids=[5, 6, 7], behavior_log_probs=[-1.0] * 3, policy_version=4)
    assert t.policy_versions == [4, 4, 4]
    t.validate()


@pytest.mark.parametrize("versions, first, pattern", [
    ([0, 1], 0, "2 policy_versions"),
    ([1, 0, 0], 1, "decrease"),
    ([1, 1, 2], 0, "first token's version is 1"),
])
def test_a_turn_with_wrong_versions_is_a_contract_error(versions, first, pattern):
    t = Turn(prompt_ids=[1], completion_ids=[5, 6, 7], behavior_log_probs=[-1.0] * 3, policy_version=first,
             policy_versions=versions)
    with pytest.raises(ContractError, match=pattern):
        t.validate()


def test_an_episode_spanning_an_update_has_its_range_and_rows_keep_the_oldest():
    ep = Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=[turn(3, [2, 2, 3]), turn(2, [3, 3])])
    ep.validate()
    assert ep.policy_version_range() == (2, 3)
    assert ep.token_policy_versions() == [0, 0, 0, 2, 2, 3, 0, 0, 3, 3]
    (row,) = ep.training_sequences([1.0, 1.0])
    assert row.policy_version == 2 and list(row.token_policy_versions) == ep.token_policy_versions()
    per_step = Episode(group_id="g", env_id="e", task_id="t", seed=0, prompt_mode="per_step",
                       turns=[turn(3, [2, 2, 3]), turn(2, [3, 3])])
    assert [r.policy_version for r in per_step.training_sequences([1.0, 1.0])] == [2, 3]
    forced = ep.training_sequences([1.0, 1.0], policy_version=9)[0]
    assert forced.policy_version == 9 and set(forced.token_policy_versions) == {0, 9}
    assert Episode(group_id="g", env_id="e", task_id="t", seed=0).policy_version_range() is None

    other = Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=[turn(2, [5, 5])])
    batch = TokenBatch.pack(ep.training_sequences([1.0, 1.0]) + other.training_sequences([0.5]), SamplingRecord())
    assert batch.policy_versions.tolist() == [2, 5]
    assert batch.token_policy_versions.dtype == torch.long and batch.token_policy_versions.shape == batch.input_ids.shape
    assert batch.token_policy_versions.tolist() == ep.token_policy_versions() + [0, 0, 5, 5]
    assert batch.select_rows([1]).token_policy_versions.tolist() == [0, 0, 5, 5]


def test_a_row_without_token_versions_has_its_version_on_every_loss_token():
    row = TokenSequence([1, 2, 3], [0, 1, 1], [-1.0, -1.0], [0.0, 1.0, 1.0], "g", 4, "e")
    assert TokenBatch.pack([row], SamplingRecord()).token_policy_versions.tolist() == [0, 4, 4]


@pytest.mark.parametrize("versions, pattern", [
    ([0, 4], "2 entries for 3 tokens"),
    ([0, 3, 4], "version 3, below the row's policy_version=4"),
    ([0, 5, 4], "decrease"),
])
def test_bad_token_versions_are_refused_at_pack(versions, pattern):
    row = TokenSequence([1, 2, 3], [0, 1, 1], [-1.0, -1.0], [0.0, 1.0, 1.0], "g", 4, "e", versions)
    with pytest.raises(ContractError, match=pattern):
        TokenBatch.pack([row], SamplingRecord())
