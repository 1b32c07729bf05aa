"""BoundedOutput: head/tail capture, incremental UTF-8 decoding, bounded memory (case C09)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxes.output import BoundedOutput, truncation_marker


def _capture(chunks: list[bytes], limit: int) -> tuple[str, int]:
    out = BoundedOutput(limit)
    for c in chunks:
        out.feed(c)
    return out.finish()


def test_C09_invalid_bytes_become_replacement_characters():
    text, dropped = _capture([b"ok\xff\xfe"], 1024)
    assert text == "ok\ufffd\ufffd"
    assert dropped == 0


def test_C09_three_byte_character_split_across_reads_arrives_intact():
    euro = "€".encode()  # b"\xe2\x82\xac"
    assert _capture([euro[:1], euro[1:2], euro[2:]], 1024) == ("€", 0)
    assert _capture([b"a" + euro[:2], euro[2:] + b"b"], 1024) == ("a€b", 0)


def test_split_character_at_the_head_boundary_is_completed_by_the_tail_when_nothing_is_dropped():
    # limit 8 -> head 4 bytes: "abc" + first byte of the euro sign; the rest goes to the tail.
    text, dropped = _capture([b"abc\xe2\x82\xacde"], 8)
    assert (text, dropped) == ("abc€de", 0)


def test_marker_format_has_thousands_separators():
    assert truncation_marker(199_934_464) == "\n[... 199,934,464 bytes truncated ...]\n"


def test_truncation_keeps_head_and_tail_and_counts_the_middle():
    data = b"H" * 10 + b"m" * 1000 + b"T" * 10
    text, dropped = _capture([data[i:i + 7] for i in range(0, len(data), 7)], 20)
    assert text == "H" * 10 + truncation_marker(1000) + "T" * 10
    assert dropped == 1000


def test_truncation_never_splits_a_character_and_counts_the_cut_bytes():
    euro = "€".encode()
    # head limit 4: "ab" + 2 of the euro's 3 bytes -> the incomplete euro is dropped (2 bytes).
    # tail limit 4: last byte of a euro + "xyz" -> the orphan continuation byte is dropped.
    data = b"ab" + euro + b"-" * 50 + euro + b"xyz"
    text, dropped = _capture([data], 8)
    assert text == "ab" + truncation_marker(dropped) + "xyz"
    assert dropped == len(data) - len(b"ab") - len(b"xyz")


def test_zero_limit_keeps_only_the_marker():
    assert _capture([b"hello"], 0) == (truncation_marker(5), 5)
    assert _capture([], 0) == ("", 0)


def test_memory_is_bounded_by_limit_plus_one_chunk():
    out = BoundedOutput(64 * 1024)
    chunk = b"x" * 65536
    for _ in range(3000):  # ~196 MB through the buffer
        out.feed(chunk)
        assert out.held_bytes <= 64 * 1024 + len(chunk)
    text, dropped = out.finish()
    assert dropped == 3000 * 65536 - 64 * 1024
    assert len(text) == 64 * 1024 + len(truncation_marker(dropped))


def test_feed_after_finish_raises():
    out = BoundedOutput(10)
    out.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        out.feed(b"x")


def test_negative_limit_is_rejected():
    with pytest.raises(ValueError, match="limit_bytes=-1"):
        BoundedOutput(-1)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=300),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=12),
    limit=st.integers(min_value=0, max_value=120),
)
def test_result_does_not_depend_on_how_the_stream_was_chunked(data, cuts, limit):
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    chunks = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert _capture(chunks, limit) == _capture([data], limit)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=300) | st.text(max_size=120).map(lambda s: s.encode()),
    limit=st.integers(min_value=0, max_value=120),
)
def test_untruncated_output_equals_plain_decode_and_truncated_output_is_bounded(data, limit):
    text, dropped = _capture([data], limit)
    if len(data) <= limit:
        assert dropped == 0
        assert text == data.decode("utf-8", errors="replace")
    else:
        # The middle is dropped, plus at most 3 bytes at each cut to keep characters whole.
        assert len(data) - limit <= dropped <= len(data) - limit + 6
        assert truncation_marker(dropped) in text
        head, _, tail = text.partition(truncation_marker(dropped))
        assert data.decode("utf-8", errors="replace").startswith(head)
        assert len(head.encode()) <= 3 * (limit // 2)  # U+FFFD is 3 bytes per replaced byte
