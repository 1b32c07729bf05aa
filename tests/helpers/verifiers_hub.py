"""The verifiers environments of the ``hub/Verifiers-v0`` tests and how to score them again.

Each case is an environment of tests/helpers/verifiers_*.py run from a hub venv that
``scripts/hub_venvs.sh`` makes (verifiers 0.3.1 for the classic API, 0.4.0 for v1, never
agentrl's own venv): ``case_kwargs(name)`` are its env kwargs (the test skips without the
venv, naming the script). ``replies_of(episode, tokenizer)`` are the completions the gateway
answered each turn with, read back from the stored tokens; ``rescore`` has verifiers score
them again (the runner's ``score`` mode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.hubs.verifiers_spec import RolloutResult, VerifiersSpec, run_runner
from tests.helpers.openenv_hub import hub_python

HELPERS = str(Path(__file__).resolve().parent)
CLASSIC_VENV = "verifiers-0.3.1"
V1_VENV = "verifiers-0.4.0"
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "classic-single": (CLASSIC_VENV, {"environment": "verifiers_single"}),
    # the env caps its own turns (8 tokens, below the run's max_new_tokens): a capped turn goes on
    "classic-multi": (CLASSIC_VENV, {"environment": "verifiers_multi", "sampling": {"max_tokens": 8}}),
    "v1": (V1_VENV, {"environment": "verifiers_taskset"}),
}
STOP_IDS = (2, 0)  # SmolLM2's <|im_end|>, <|endoftext|>: the gateway drops a trailing one from the content


def case_kwargs(name: str) -> dict[str, Any]:
    """The env kwargs of case ``name`` (``CASES``); skips when its hub venv is missing."""
    venv, extra = CASES[name]
    return {"python": hub_python(venv), "python_path": [HELPERS], **extra}


def replies_of(episode: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """Each turn's reply as the gateway sent it: the sampled ids less a trailing stop token,
    decoded with special tokens kept; ``length`` where the engine cut the turn."""
    out = []
    for turn in episode.turns:
        ids = list(turn.completion_ids)
        body = ids[:-1] if ids and ids[-1] in STOP_IDS else ids
        out.append({"content": tokenizer.decode(body, skip_special_tokens=False),
                    "finish_reason": "length" if turn.finish_reason == "length" else "stop",
                    "completion_tokens": len(ids)})
    return out


def rescore(kwargs: dict[str, Any], task_id: str, replies: list[dict[str, Any]], max_new_tokens: int) -> RolloutResult:
    """verifiers' own result for ``replies`` on task ``task_id``: the same rollout, its calls
    answered by the replies in order (the runner's ``score`` mode)."""
    spec = VerifiersSpec.from_kwargs(kwargs)
    split, index = task_id.split("/")
    request = spec.request("score", split=split, index=int(index), model="agentrl-policy",
                           max_new_tokens=max_new_tokens, replies=replies)
    return RolloutResult.from_answer(run_runner(spec, request, f"score of {task_id!r}"))
