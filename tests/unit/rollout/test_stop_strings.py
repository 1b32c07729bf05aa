"""Stop strings (agentrl/rollout/stop_strings.py) on a byte-level tokenizer stand-in: the cut is
the shortest prefix whose text holds the string, the engine's incremental tail check finds a
string that began before the tokens it had checked, and an empty stop string is refused."""

from __future__ import annotations

import pytest

from agentrl.config import load_default_config
from agentrl.rollout.stop_strings import cut_at_stop, tail_holds_stop

# each id is one chunk of text, as a tokenizer's pieces are
PIECES = ["Let", " me", " look", ".", "<tool", "_call", ">{", "}</", "tool", "_call", ">\n", "The", " output"]


def decode(ids):
    return "".join(PIECES[i] for i in ids)


def test_the_cut_keeps_the_token_that_completes_the_stop_string():
    ids = list(range(len(PIECES)))
    assert cut_at_stop(ids, decode, ["</tool_call>"]) == 11  # ">\n" completes it
    assert cut_at_stop(ids, decode, ["<tool_call>", "nothing"]) == 7  # the first one in the text wins
    assert cut_at_stop(ids, decode, ["absent"]) is None
    assert cut_at_stop([], decode, ["x"]) is None and cut_at_stop(ids, decode, []) is None


def test_the_tail_check_sees_a_stop_string_that_began_before_the_checked_tokens():
    ids = list(range(len(PIECES)))
    # checked up to 9 tokens: "}</" "tool" (before) and "_call" ">\n" (new) together complete it
    assert tail_holds_stop(ids[:11], decode, ["</tool_call>"], checked=9)
    assert not tail_holds_stop(ids[:10], decode, ["</tool_call>"], checked=9)
    assert not tail_holds_stop(ids[:11], decode, ["</tool_call>"], checked=11)  # nothing new


def test_an_empty_stop_string_is_a_config_error_naming_it():
    with pytest.raises(ValueError, match=r"rollout.stop_strings=\['</tool_call>', ''\] holds an empty string"):
        load_default_config(["rollout.stop_strings=['</tool_call>', '']"])
