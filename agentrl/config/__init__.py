"""The run configuration: pydantic models, loaded from YAML plus ``key=value`` overrides.

Every field carries its default and why. Validation happens here, in one place, and a bad
key or value raises ``ConfigError`` naming the key, the value and what was expected. The
``trainer`` and ``critic`` sections are built from the trainers' dataclasses
(``agentrl.trainer.config``): each field's type, default and description is the dataclass
field's, and the dataclasses' own ``validate()`` checks the values.

Modules: ``sections`` (run, model, env, rollout, sandbox, algorithm), ``trainer_sections``
(trainer, critic), ``placement`` (cluster), ``loop_sections`` (controller, eval, replay,
logging), ``run_config`` (``Config``, its cross-checks, ``trainer_configs``),
``user_modules`` (``env.import_modules``) and ``loading`` (YAML, overrides, the embedded
default). Every public name is re-exported here.

Example::
    cfg = load_config("examples/humaneval.yaml", ["rollout.max_turns=2", "run.iterations=5"])
"""

from __future__ import annotations

from agentrl.config.base import Section
from agentrl.config.loading import (
    DEFAULT_CONFIG_RESOURCE,
    code_defaults,
    config_from_dict,
    default_config_text,
    load_config,
    load_default_config,
)
from agentrl.config.loop_sections import (
    ControllerConfig,
    EvalConfig,
    LoggingConfig,
    ReplayConfig,
    WandbConfig,
)
from agentrl.config.placement import (
    ClusterConfig,
    PlacementConfig,
    RolePlacement,
    SandboxPlacement,
)
from agentrl.config.run_config import Config, trainer_configs
from agentrl.config.sections import (
    AlgorithmConfig,
    EnvConfig,
    GiGPOSection,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    SandboxConfig,
)
from agentrl.config.trainer_sections import (
    CriticSection,
    KLSection,
    RolloutCorrectionSection,
    TrainerSection,
    check_reference_vocab,
)
from agentrl.config.user_modules import modules_imported_with

__all__ = [
    "DEFAULT_CONFIG_RESOURCE",
    "AlgorithmConfig",
    "ClusterConfig",
    "Config",
    "ControllerConfig",
    "CriticSection",
    "EnvConfig",
    "EvalConfig",
    "GiGPOSection",
    "KLSection",
    "LoggingConfig",
    "ModelConfig",
    "PlacementConfig",
    "ReplayConfig",
    "RolePlacement",
    "RolloutConfig",
    "RolloutCorrectionSection",
    "RunConfig",
    "SandboxConfig",
    "SandboxPlacement",
    "Section",
    "TrainerSection",
    "WandbConfig",
    "check_reference_vocab",
    "code_defaults",
    "config_from_dict",
    "default_config_text",
    "load_config",
    "load_default_config",
    "modules_imported_with",
    "trainer_configs",
]
