"""The prepared model folders in vLLM's CPU build, in-process (``tests/conftest.py`` sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``VLLM_CPU_KVCACHE_SPACE=1``,
``VLLM_CPU_NUM_OF_RESERVED_CPU=0``).

One engine per class (class-scoped fixtures), so at most one is alive at a time.
"""

from __future__ import annotations

import gc
import math

import pytest

pytest.importorskip("vllm")

pytestmark = pytest.mark.slow

ENGINE_KWARGS = dict(enforce_eager=True, max_model_len=2048, seed=0)


def _engine(path: str, dtype: str):
    from vllm import LLM

    return LLM(model=path, dtype=dtype, **ENGINE_KWARGS)


def _chat_prompt(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


class TestSmolLM2Float32:
    @pytest.fixture(scope="class")
    def engine(self, smollm2_path):
        llm = _engine(smollm2_path, "float32")
        yield llm
        del llm
        gc.collect()

    def test_greedy_matches_transformers_token_for_token(self, engine, smollm2_path, smollm2_tokenizer):
        import torch
        from transformers import AutoModelForCausalLM
        from vllm import SamplingParams

        prompt = _chat_prompt(smollm2_tokenizer, "What is 2 + 3?")
        out = engine.generate(
            [{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=24, logprobs=0)
        )[0].outputs[0]
        vllm_ids = list(out.token_ids)

        model = AutoModelForCausalLM.from_pretrained(smollm2_path).eval()
        with torch.no_grad():
            hf = model.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=24, do_sample=False,
            )
            hf_ids = hf[0, len(prompt):].tolist()
            assert vllm_ids == hf_ids
            assert out.finish_reason == "stop" and vllm_ids[-1] == 2
            assert "5" in smollm2_tokenizer.decode(vllm_ids, skip_special_tokens=True)

            # One log-prob per sampled token, and they agree with the fp32 HF forward pass.
            logits = model(hf).logits[0, len(prompt) - 1 : -1]  # (n, vocab) float32
            hf_log_probs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(hf_ids)[:, None])[:, 0]
        assert len(out.logprobs) == len(vllm_ids)
        vllm_log_probs = [step[token].logprob for step, token in zip(out.logprobs, vllm_ids)]
        gap = max(abs(a - b) for a, b in zip(vllm_log_probs, hf_log_probs.tolist()))
        assert gap < 1e-3, gap


class TestTinyRandomSmolLM2:
    @pytest.fixture(scope="class")
    def engine(self, tiny_model_path):
        llm = _engine(tiny_model_path, "float32")
        yield llm
        del llm
        gc.collect()

    def test_generates_with_one_log_prob_per_sampled_token(self, engine, smollm2_tokenizer):
        from vllm import SamplingParams

        prompt = _chat_prompt(smollm2_tokenizer, "Say something.")
        params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, logprobs=0, seed=3)
        outs = engine.generate([{"prompt_token_ids": prompt}] * 4, params)
        assert len(outs) == 4
        for request in outs:
            completion = request.outputs[0]
            assert len(completion.token_ids) == 16 and completion.finish_reason == "length"
            assert all(0 <= t < 49152 for t in completion.token_ids)
            assert len(completion.logprobs) == 16
            for step, token in zip(completion.logprobs, completion.token_ids):
                log_prob = step[token].logprob
                assert math.isfinite(log_prob) and log_prob <= 0.0

    @pytest.mark.parametrize("stop_id", [2, 0])
    def test_each_generation_config_stop_id_ends_the_completion(self, engine, smollm2_tokenizer, stop_id):
        """``generation_config.json`` declares ``[2, 0]``: vLLM stops on either (case C07)."""
        from vllm import SamplingParams

        prompt = _chat_prompt(smollm2_tokenizer, "Stop.")
        params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0, logit_bias={stop_id: 100.0})
        completion = engine.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0]
        assert list(completion.token_ids) == [stop_id]
        assert completion.finish_reason == "stop"
        assert len(completion.logprobs) == 1
