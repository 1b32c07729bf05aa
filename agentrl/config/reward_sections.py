"""The ``reward`` section: where a run's reward comes from besides its environment's rule: a
judge (an OpenAI-compatible endpoint, or a local judge pool of engines that are never
trained), the rubric it judges by, and how its score combines with the rule's
(``agentrl.rewards``; docs/rewards.md)."""

from __future__ import annotations

import math
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from agentrl.config.base import Section

_SECRET_KEYS = ("api_key", "key", "token", "secret", "password", "authorization")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class JudgeConfig(Section):
    """One judge: ``kind: endpoint`` (any OpenAI-compatible server, through the ``openai``
    SDK) or ``kind: pool`` (a local pool of vLLM engines with their own model, placed with
    ``cluster.placement.judge``, never trained)."""

    kind: Literal["endpoint", "pool"] = Field(
        "endpoint", description="endpoint: an OpenAI-compatible server at base_url. pool: local vLLM engines "
                                "serving model (guided JSON decoding), started and torn down with the run.")
    model: str = Field(..., min_length=1, description="The judge model: the name the endpoint serves, or for a pool a "
                                                      "model path or registry name as model.path takes.")
    base_url: str | None = Field(None, description="endpoint: the server's OpenAI base URL, e.g. "
                                                   "http://127.0.0.1:8000/v1.")
    api_key_env: str | None = Field(None, description="endpoint: the NAME of the environment variable that holds the "
                                                      "API key (never the key itself: a key in a config file is "
                                                      "refused). None: no key (a local server).")
    max_concurrency: int = Field(8, ge=1, description="Judge calls in flight at once, over all engines of the run.")
    max_retries: int = Field(3, ge=0, description="Retries of a call that failed for the infrastructure's sake "
                                                  "(connection, timeout, HTTP 429 or 5xx, an empty answer), with "
                                                  "exponential backoff; then the episode is a reward error.")
    backoff_s: float = Field(1.0, ge=0.0, description="First retry's wait in seconds; doubled each retry, with jitter.")
    timeout_s: float = Field(120.0, gt=0.0, description="Seconds one judge call may take.")
    temperature: float = Field(0.0, ge=0.0, description="The judge's sampling temperature (0: greedy, the same "
                                                        "answer for the same prompt, which the cache relies on).")
    max_tokens: int = Field(1024, ge=1, description="Most tokens of one judge answer.")
    structured: bool = Field(True, description="Ask for the rubric's JSON schema as response_format (an endpoint "
                                               "that rejects it: set false; the answer is still checked against "
                                               "the schema). A pool always decodes under the schema.")
    num_engines: int = Field(1, ge=1, description="pool: vLLM engines of the judge pool.")
    dtype: str = Field("auto", description="pool: the judge engines' dtype (auto: the model's own; float32 on CPU).")
    kv_cache_gb: float = Field(1.0, gt=0.0, description="pool: KV cache per judge engine, GiB.")
    max_context_tokens: int = Field(4096, ge=64, description="pool: the judge engines' context length.")

    @model_validator(mode="before")
    @classmethod
    def _no_secret_in_the_file(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for k in data:
                if str(k).lower() in _SECRET_KEYS:
                    raise ValueError(f"{k}: an API key does not belong in a config file (it ends up in the run "
                                     "directory and the replay store); put it in an environment variable and name "
                                     "that variable in api_key_env")
        return data

    @model_validator(mode="before")
    @classmethod
    def _env_name_and_plain_url(cls, data: Any) -> Any:
        # a model validator: the loader names the field and never shows a model validator's
        # input, so a key pasted here is never printed back
        v = data.get("api_key_env") if isinstance(data, dict) else None
        if v is not None and not (isinstance(v, str) and _ENV_NAME.match(v)):
            raise ValueError("api_key_env: expected the NAME of an environment variable "
                             "([A-Za-z_][A-Za-z0-9_]*), e.g. OPENAI_API_KEY; the value given is not one (not shown: it "
                             "may be a key)")
        url = data.get("base_url") if isinstance(data, dict) else None
        if isinstance(url, str):
            try:
                parts = urlsplit(url)
                carries = bool(parts.username or parts.password or parts.query)
            except ValueError:
                carries = False  # not a URL at all: the check below names it
            if carries:
                raise ValueError("base_url carries credentials or a query string (not shown); give the server's "
                                 "plain base URL and the key's variable in api_key_env")
        return data

    @model_validator(mode="after")
    def _endpoint_has_url(self) -> JudgeConfig:
        if self.kind == "endpoint":
            if not self.base_url or not self.base_url.startswith(("http://", "https://")):
                raise ValueError(f"base_url={self.base_url!r}; kind endpoint needs the server's "
                                 "http(s) OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
        return self


class RewardConfig(Section):
    """The run's reward besides the environment's rule (docs/rewards.md)."""

    judge: JudgeConfig | None = Field(None, description="The judge that scores each episode as it ends; None: the "
                                                        "environment's rule reward alone.")
    rubric: dict[str, Any] | None = Field(None, description="The rubric the judge scores by (name, criteria with "
                                                            "weights and gates, template, mode single or group, "
                                                            "answer final or transcript); None: the environment's "
                                                            "own (its class's judge_rubric).")
    combine: Literal["judge", "rule_first", "weighted"] = Field(
        "rule_first", description="How the judge's score and the environment's rule reward make the reward. judge: "
                                  "the judge's score. rule_first: the rule's reward when it reaches rule_pass (a "
                                  "rule that says correct is trusted, no judge call is paid), else the judge's. "
                                  "weighted: rule_weight * rule + (1 - rule_weight) * judge.")
    rule_weight: float = Field(0.5, ge=0.0, le=1.0, description="weighted: the rule reward's weight.")
    rule_pass: float = Field(1.0, description="rule_first: the rule reward at or above which the rule decides.")
    success_threshold: float = Field(0.5, description="With a judge, an episode succeeded when its reward is at or "
                                                      "above this (Episode.success, rollout/success_rate, pass@k), "
                                                      "whether the judge scored it or the rule decided alone.")

    @field_validator("rule_pass", "success_threshold")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"got {v}; expected a finite reward")
        return v
