"""A vLLM V1 logits processor that makes a real engine sample a scripted completion, for tests
that need a text the tiny random model would never write (a tool call with a closing tag in
its argument). Pass the class to ``VLLMEngine(logits_processors=[ScriptedTokens])`` and set
``ScriptedTokens.script`` (token ids) and ``ScriptedTokens.end_id`` before adding requests.

Every request of that engine then samples ``script`` token by token (all other logits -inf,
so the sampled id is certain whatever the temperature), then ``end_id`` forever. A request
whose prompt already ends with the first ``m`` ids of the script (a continuation after a
preemption: prompt + the ids sampled so far) goes on from id ``m``.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates


class ScriptedTokens(LogitsProcessor):
    script: tuple[int, ...] = ()
    end_id: int = 0

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[int, list[int]]] = {}  # batch index -> (script offset, output ids (live))

    @classmethod
    def _offset(cls, prompt: list[int] | None) -> int:
        prompt = list(prompt or [])
        for m in range(min(len(cls.script), len(prompt)), 0, -1):
            if prompt[-m:] == list(cls.script[:m]):
                return m
        return 0

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, lambda params, prompt, out: (self._offset(prompt), out))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (offset, out) in self.rows.items():
            pos = offset + len(out)
            tok = self.script[pos] if pos < len(self.script) else self.end_id
            logits[index] = float("-inf")
            logits[index, tok] = 0.0
        return logits
