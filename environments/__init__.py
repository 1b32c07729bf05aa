"""agentrl's environments: Gymnasium envs whose actions and observations are text.

Importing this package registers them with Gymnasium (``environments.registry``), loads
the ``agentrl.environments`` entry points of installed packages and imports the modules
named in ``AGENTRL_ENV_MODULES``::

    import environments
    env = environments.make_env("agentrl/HumanEval-v0", sandbox=sandbox)

Built-ins: ``agentrl/HumanEval-v0`` (``humaneval``), ``agentrl/ShellTasks-v0``
(``shell_tasks``), ``agentrl/Sokoban-v0`` (``sokoban``, no sandbox), ``agentrl/TextWorld-v0``
(``textworld_env``, needs the ``textworld`` package). Bring your own: a ``gymnasium.Env``
with text actions and observations, a classmethod ``task_ids(split)`` and, for the checker,
``checker_actions()``; register it (``environments.registry`` lists the three ways) and run
``environments.checker.check_env(env_id, sandbox_factory=...)``. ``examples/custom_env.py``
does all of it in under 60 lines.

Environments receive their sandbox (``sandboxes.base.Sandbox``) and never create or close
it. They import gymnasium, the sandbox interface, ``agentrl.types`` and ``agentrl.errors``
only (docs/design.md, "Who may import whom").
"""

from environments.humaneval import ENV_ID as HUMANEVAL_ENV_ID
from environments.humaneval import HumanEvalEnv, ScoreReport, score_solutions, task_ids
from environments.registry import (
    ENTRY_POINT_GROUP,
    env_class,
    import_env_modules,
    load_entry_points,
    make_env,
    register_envs,
    registered_env_ids,
)
from environments.tools import (
    FencedCodeParser,
    HermesToolParser,
    ToolCall,
    get_parser,
)

register_envs()
load_entry_points(strict=False)  # a broken package logs a warning; make_env raises it
import_env_modules()  # AGENTRL_ENV_MODULES, if set

__all__ = [
    "HUMANEVAL_ENV_ID",
    "HumanEvalEnv",
    "ScoreReport",
    "score_solutions",
    "task_ids",
    "register_envs",
    "registered_env_ids",
    "ENTRY_POINT_GROUP",
    "env_class",
    "import_env_modules",
    "load_entry_points",
    "make_env",
    "FencedCodeParser",
    "HermesToolParser",
    "ToolCall",
    "get_parser",
]
