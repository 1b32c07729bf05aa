"""The flat weight buffer of ``agentrl.cluster.engines.weight_sync``: packing keeps every tensor's
values, dtype and shape, lays same-dtype tensors back to back (so q/k/v stay adjacent), and
reuses its memory across syncs; ``weight_load._fused`` gives the fused q/k/v weight as a
view when the parts are adjacent and as a copy when they are not."""

from __future__ import annotations

import pytest
import torch

from agentrl.cluster.engines.weight_sync import FlatBuffer, FlatLayout
from agentrl.errors import ClusterError
from agentrl.rollout.weight_load import _fused


def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"q.weight": torch.randn(8, 4, generator=g), "k.weight": torch.randn(2, 4, generator=g),
            "v.weight": torch.randn(2, 4, generator=g), "norm.weight": torch.randn(4, generator=g),
            "half": torch.randn(3, generator=g).to(torch.bfloat16), "after": torch.randn(5, generator=g)}


def test_pack_round_trips_values_dtypes_and_shapes():
    state = _state()
    layout, buf = FlatBuffer().pack(state)
    views = layout.views(buf)
    assert list(views) == list(state)
    for name, t in state.items():
        assert views[name].dtype == t.dtype and views[name].shape == t.shape
        assert torch.equal(views[name], t)
    offsets = {s.name: s for s in layout.slots}
    assert offsets["k.weight"].offset == offsets["q.weight"].offset + offsets["q.weight"].nbytes
    assert offsets["after"].offset % 4 == 0  # aligned to its dtype after the 6-byte bf16 slot
    assert layout.nbytes == offsets["after"].offset + offsets["after"].nbytes


def test_buffer_is_reused_across_syncs():
    fb = FlatBuffer()
    _, first = fb.pack(_state(0))
    layout, second = fb.pack(_state(1))
    assert first.data_ptr() == second.data_ptr()
    assert torch.equal(layout.views(second)["q.weight"], _state(1)["q.weight"])


def test_views_refuse_a_buffer_of_another_size():
    layout = FlatLayout.of(_state())
    with pytest.raises(ClusterError, match="does not fit"):
        layout.views(torch.empty(layout.nbytes - 1, dtype=torch.uint8))


def test_fused_is_a_view_when_adjacent_and_a_copy_when_not():
    state = _state()
    layout, buf = FlatBuffer().pack(state)
    v = layout.views(buf)
    parts = [v["q.weight"], v["k.weight"], v["v.weight"]]
    fused = _fused(parts)
    assert fused.shape == (12, 4) and torch.equal(fused, torch.cat([state[k] for k in ("q.weight", "k.weight", "v.weight")]))
    assert fused.data_ptr() == parts[0].data_ptr()  # no copy
    apart = _fused([v["q.weight"], v["v.weight"]])  # k lies between them: must be copied
    assert torch.equal(apart, torch.cat([state["q.weight"], state["v.weight"]]))
    assert apart.data_ptr() != parts[0].data_ptr()
