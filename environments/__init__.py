"""agentrl's environments: Gymnasium envs whose actions and observations are text.

Importing this package registers them with Gymnasium (``environments.registry``)::

    import gymnasium, environments
    env = gymnasium.make("agentrl/HumanEval-v0", sandbox=sandbox)

Environments receive their sandbox (``sandboxes.base.Sandbox``) and never create or close
it. They import gymnasium, the sandbox interface, ``agentrl.types`` and ``agentrl.errors``
only (design.md, "Who may import whom").
"""

from environments.humaneval import ENV_ID as HUMANEVAL_ENV_ID
from environments.humaneval import HumanEvalEnv, ScoreReport, score_solutions, task_ids
from environments.registry import register_envs, registered_env_ids
from environments.tools import (
    FencedCodeParser,
    HermesToolParser,
    ToolCall,
    get_parser,
    render_tools_for_prompt,
)

register_envs()

__all__ = [
    "HUMANEVAL_ENV_ID",
    "HumanEvalEnv",
    "ScoreReport",
    "score_solutions",
    "task_ids",
    "register_envs",
    "registered_env_ids",
    "FencedCodeParser",
    "HermesToolParser",
    "ToolCall",
    "get_parser",
    "render_tools_for_prompt",
]
