"""Column codecs of the replay store: pure functions, no database."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.errors import ContractError
from agentrl.replay.models import (
    decode_anchor,
    encode_anchor,
    escape_text,
    pack_floats,
    pack_token_ids,
    unescape_text,
    unpack_floats,
    unpack_token_ids,
)

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@given(st.lists(INT32, max_size=200))
def test_token_ids_round_trip(ids: list[int]) -> None:
    blob = pack_token_ids(ids)
    assert len(blob) == 4 * len(ids)
    back = unpack_token_ids(blob)
    assert back == ids and all(type(x) is int for x in back)


@given(st.lists(st.floats(allow_nan=False), max_size=200))
def test_floats_round_trip_bit_exact(values: list[float]) -> None:
    back = unpack_floats(pack_floats(values))
    assert struct.pack(f"<{len(values)}d", *back) == struct.pack(f"<{len(values)}d", *values)
    assert all(type(x) is float for x in back)


def test_floats_keep_negative_zero_and_tiny_values() -> None:
    values = [-0.0, -1e-30, -5e-324, -1e-308, float(np.float32(-0.1))]
    back = unpack_floats(pack_floats(values))
    assert back == values
    assert math.copysign(1.0, back[0]) == -1.0
    assert pack_floats(values)[:8] == b"\x00" * 7 + b"\x80"  # little-endian -0.0


def test_token_ids_accept_numpy_and_refuse_what_int32_cannot_hold() -> None:
    assert unpack_token_ids(pack_token_ids(np.array([5, 6], dtype=np.int64))) == [5, 6]
    assert pack_token_ids([]) == b"" and unpack_token_ids(b"") == []
    with pytest.raises(ContractError, match="completion_ids contain 2147483648"):
        pack_token_ids([1, 2**31], what="completion_ids")
    with pytest.raises(ContractError, match="contain -2147483649"):
        pack_token_ids([-(2**31) - 1])
    with pytest.raises(ContractError, match="flat list of ints"):
        pack_token_ids([1.5, 2.0])
    with pytest.raises(ContractError, match="flat list of floats"):
        pack_floats([[1.0], [2.0]])


@pytest.mark.parametrize(
    ("anchor", "kind"),
    [("obs text", "str"), ("", "str"), (3, "literal"), (-0.0, "literal"), (None, "literal"),
     (True, "literal"), ((1, (2, "a"), b"\x00"), "literal"), ((), "literal")],
)
def test_anchor_literals_round_trip_exactly(anchor: object, kind: str) -> None:
    text, got_kind = encode_anchor(anchor)
    assert got_kind == kind
    back = decode_anchor(text, got_kind)
    assert back == anchor and type(back) is type(anchor) and repr(back) == repr(anchor)


@pytest.mark.parametrize("anchor", [frozenset({1}), float("nan"), (1, float("inf"))])
def test_other_anchors_are_kept_as_their_repr(anchor: object) -> None:
    text, kind = encode_anchor(anchor)
    assert kind == "repr" and text == repr(anchor)
    assert decode_anchor(text, kind) == repr(anchor)


def test_unknown_anchor_kind_is_refused() -> None:
    with pytest.raises(ContractError, match="anchor_kind='pickle'"):
        decode_anchor("x", "pickle")


@given(st.text(alphabet=st.characters(codec=None, exclude_categories=())))
def test_text_escape_round_trips_every_string(value: str) -> None:
    stored = escape_text(value)
    assert "\x00" not in stored
    stored.encode("utf-8")  # storable by every driver
    assert unescape_text(stored) == value


def test_text_escape_leaves_ordinary_text_alone() -> None:
    for s in ["", "plain", "ünïcödé ✓ 漢字", "ok\ufffd", 'json-like "\\u0000"']:
        assert escape_text(s) == s
    for s in ["a\x00b", "lone \ud800", "\ufdd0starts with the marker"]:
        assert escape_text(s) != s and unescape_text(escape_text(s)) == s
