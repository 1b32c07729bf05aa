"""A stand-in tokenizer for the rollout loop's unit tests (beside the real-tokenizer tests in
tests/integration/rollout): one id per character, a chat template of tags, and ``STOP``
decoding to the template's end tag, so ``ChatTokenizer``'s probes pass."""

from __future__ import annotations

STOP = 2


class CharTokenizer:
    chat_template = "char"

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False, tools=None):
        return "".join(f"<{m['role']}>{m['content']}</s>" for m in msgs) + ("<a>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 50 + 3 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "</s>" if list(ids) == [STOP] else "x" * len(ids)
