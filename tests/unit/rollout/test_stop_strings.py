"""Stop strings (agentrl/rollout/stop_strings.py) on a byte-level tokenizer stand-in: the cut is
the shortest prefix whose text holds the string, the engine's incremental check finds a
string that began before the tokens it had read, and an empty stop string is refused."""

from __future__ import annotations

import pytest

from agentrl.config import load_default_config
from agentrl.rollout.stop_strings import StopCheck, cut_at_stop
from tests.helpers.engine_outputs import FakeOutput, stop_bookkeeping_engine

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


def test_the_incremental_check_sees_a_stop_string_that_began_before_the_ids_it_had_read():
    ids = list(range(len(PIECES)))
    check = StopCheck(["</tool_call>"])
    # read up to 9 ids: "}</" "tool" (before) and "_call" ">\n" (new) together complete it
    assert not check.advance(decode, ids[:9], finished=False) and check.read == 9
    assert not check.advance(decode, ids[:10], finished=False)
    assert check.advance(decode, ids[:11], finished=False)
    assert not check.advance(decode, ids[:11], finished=False)  # nothing new


def test_an_empty_stop_string_is_a_config_error_naming_it():
    with pytest.raises(ValueError, match=r"rollout.stop_strings=\['</tool_call>', ''\] holds an empty string"):
        load_default_config(["rollout.stop_strings=['</tool_call>', '']"])


def _engine():
    return stop_bookkeeping_engine(decode)


def _watch(eng, rid, stops=("</tool_call>",), context=()):
    eng._watch_stops(rid, stops, context)


def test_the_engine_cuts_a_finished_completion_at_its_stop_string_but_keeps_a_stop_token_right_after_it():
    eos = len(PIECES)
    pieces = PIECES + ["<|im_end|>"]

    def dec(ids):
        return "".join(pieces[i] for i in ids)

    eng = _engine()
    eng.decode = dec
    _watch(eng, "a")
    cut = eng._stopped("a", FakeOutput(range(13), "length"), finished=True)
    assert cut.token_ids == tuple(range(11)) and cut.finish_reason == "stop" and cut.stop_token_id is None
    _watch(eng, "b")  # "...</tool_call>" then the stop token: as vLLM ended it
    assert eng._stopped("b", FakeOutput([*range(11), eos], "stop"), finished=True) is None
    _watch(eng, "c")  # unfinished: nothing yet, then the tokens that complete it
    assert eng._stopped("c", FakeOutput(range(9))) is None and eng._stops["c"].read == 9
    assert eng._stopped("c", FakeOutput(range(12))).token_ids == tuple(range(11))  # step() then aborts it
