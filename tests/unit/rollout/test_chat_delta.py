"""Delta tokenization through SmolLM2's real chat template (invariant 1; cases C01, C02)."""

import pytest

from agentrl.errors import TemplateError
from agentrl.rollout.chat import ChatTokenizer

TOOLS = [{"type": "function", "function": {"name": "python", "description": "Run Python.",
          "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]


@pytest.fixture(scope="module")
def chat(smollm2_tokenizer):
    return ChatTokenizer(smollm2_tokenizer, (2, 0))


def test_C02_turn_by_turn_equals_full_rendering(chat, smollm2_tokenizer):
    # two tool calls -> tool result A -> tool result B -> assistant, built turn by turn
    chat.check_incremental(tools=TOOLS)
    msgs = chat.initial_messages("sys", "question", TOOLS)
    a1 = 'calling\n<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>\n<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>'
    stream = chat.prompt_ids(msgs, TOOLS)
    mask = [0] * len(stream)
    a1_ids = smollm2_tokenizer.encode(a1, add_special_tokens=False) + [2]
    stream += a1_ids
    mask += [1] * len(a1_ids)
    delta = chat.delta_ids([{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])
    stream += delta
    mask += [0] * len(delta)
    a2_ids = smollm2_tokenizer.encode("done", add_special_tokens=False) + [2]
    stream += a2_ids
    mask += [1] * len(a2_ids)
    full = msgs + [{"role": "assistant", "content": a1}, {"role": "tool", "content": "1"},
                   {"role": "tool", "content": "2"}, {"role": "assistant", "content": "done"}]
    rendered = smollm2_tokenizer.apply_chat_template(full, tokenize=False)
    assert rendered.endswith("<|im_end|>\n")
    expected = smollm2_tokenizer.encode(rendered[: -len("\n")], add_special_tokens=False)
    assert stream == expected
    # loss_mask is 1 exactly on the assistant-generated spans
    text_of_masked = smollm2_tokenizer.decode([t for t, m in zip(stream, mask) if m], skip_special_tokens=False)
    assert text_of_masked == a1 + "<|im_end|>" + "done" + "<|im_end|>"
    assert "<|im_start|>tool" in smollm2_tokenizer.decode(delta, skip_special_tokens=False)


def test_delta_starts_with_glue_after_the_stop_token_and_ends_with_generation_prompt(chat, smollm2_tokenizer):
    delta = chat.delta_ids([{"role": "user", "content": "obs"}])
    assert smollm2_tokenizer.decode(delta, skip_special_tokens=False) == "\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"


def _non_injective_pair(tok):
    """Find ids [x, y] whose decoded text re-encodes to different ids (BPE is not one-to-one)."""
    for word in ["hello", "world", "def", "return", "print", "answer", "python", "number"]:
        ids = tok.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            continue
        text = tok.decode(ids)
        for cut in range(1, len(text)):
            x = tok.encode(text[:cut], add_special_tokens=False)
            y = tok.encode(text[cut:], add_special_tokens=False)
            if len(x) == 1 and len(y) == 1:
                return [x[0], y[0]], ids
    raise AssertionError("no non-injective pair found")


def test_C01_sampled_ids_are_kept_even_when_text_reencodes_differently(chat, smollm2_tokenizer):
    pair, merged = _non_injective_pair(smollm2_tokenizer)
    assert smollm2_tokenizer.encode(smollm2_tokenizer.decode(pair), add_special_tokens=False) == merged != pair
    from agentrl.types import Episode, Turn

    prompt = chat.prompt_ids(chat.initial_messages(None, "q"))
    obs = chat.delta_ids([{"role": "tool", "content": "out"}])
    ep = Episode(group_id="g", env_id="e", task_id="t", seed=0)
    ep.turns.append(Turn(prompt_ids=prompt, completion_ids=pair + [2], behavior_log_probs=[-1.0, -1.0, -0.1]))
    ep.turns.append(Turn(prompt_ids=obs, completion_ids=[2], behavior_log_probs=[-0.5]))
    ep.validate()
    assert ep.token_ids() == prompt + pair + [2] + obs + [2]
    assert sum(ep.loss_mask()) == len(ep.behavior_log_probs()) == 4


def test_template_that_rewrites_history_is_refused_at_start_up(smollm2_tokenizer):
    import copy

    tok = copy.deepcopy(smollm2_tokenizer)
    # A template that shows only the last assistant message (as reasoning templates that strip
    # earlier thoughts do) cannot be extended turn by turn.
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
    )
    c = ChatTokenizer(tok, (2,))
    with pytest.raises(TemplateError, match="turn by turn"):
        c.check_incremental()


def test_tools_go_into_the_system_prompt_when_the_template_ignores_them(chat):
    assert chat.renders_tools is False
    msgs = chat.initial_messages("Be brief.", "q", TOOLS)
    assert msgs[0]["role"] == "system" and "<tool_call>" in msgs[0]["content"] and "python" in msgs[0]["content"]


def test_example_turns_sit_between_the_system_message_and_the_task(chat, smollm2_tokenizer):
    examples = [{"role": "user", "content": "Task: say hi"}, {"role": "assistant", "content": "hi"}]
    msgs = chat.initial_messages("sys", "question", examples=examples)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[1:3] == examples and msgs[1] is not examples[0] and msgs[-1]["content"] == "question"
    assert chat.initial_messages("sys", "question") == [msgs[0], msgs[-1]]
    # still a prefix of the full rendering, so the episode's later turns extend it by delta
    ids = chat.prompt_ids(msgs)
    rendered = smollm2_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ids == smollm2_tokenizer.encode(rendered, add_special_tokens=False)
