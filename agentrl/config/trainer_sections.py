"""The ``trainer`` and ``critic`` sections of the run config, built from the trainers'
dataclasses (``agentrl.trainer.config``): each field's type, default and description is the
dataclass field's, and the dataclass's own ``validate()`` checks the values. Also the
builders that turn a validated section back into its dataclass, and the check that a KL
reference model shares the policy's vocabulary."""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, create_model, model_validator

import agentrl.trainer.config as _tc
from agentrl.config.base import Section
from agentrl.errors import ConfigError


def as_value_error(check: Any, prefix: str) -> None:
    """Run a dataclass ``validate`` and turn its ``ConfigError`` into the ``ValueError``
    pydantic collects, with the run-config key prefix (``trainer.``) on the message."""
    try:
        check()
    except ConfigError as exc:
        raise ValueError(f"{prefix}{exc}") from None


def _dataclass_fields(
    cls: type,
    keys: Sequence[str],
    *,
    own: dict[str, Any] | None = None,
    notes: dict[str, str] | None = None,
    sections: dict[str, type[BaseModel]] | None = None,
) -> dict[str, Any]:
    """The field definitions (``pydantic.create_model``'s) of a section that embeds the
    trainer dataclass ``cls`` (``agentrl.trainer.config``), in the order of ``keys``.

    Each key is the dataclass field of the same name: its type (``typing.get_type_hints``,
    so a choice is the dataclass's ``Literal``), its default and its documentation
    (``field_doc``), declared once, there. ``own`` holds the section-only fields (pydantic
    ``(type, Field)`` pairs), ``notes`` text the run config appends to a field's
    documentation, and ``sections`` the section that stands for a field whose type is a
    dataclass (built with its default). Value ranges are checked by the dataclass's own
    ``validate`` (``_DataclassSection`` and ``Config``'s cross-checks), which names the
    key, the value and what was expected."""
    own, notes, sections = own or {}, notes or {}, sections or {}
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key in keys:
        if key in own:
            out[key] = own[key]
            continue
        doc = _tc.field_doc(cls, key) + (f" {notes[key]}" if key in notes else "")
        if key in sections:
            out[key] = (sections[key], Field(default_factory=sections[key], description=doc))
        else:
            out[key] = (hints[key], Field(by_name[key].default, description=doc))
    return out


class _DataclassSection(Section):
    """A sub-section that is one trainer dataclass (``_dataclass``, every field of the same
    name), checked by that dataclass's ``validate`` with the run-config key ``_prefix``."""

    _dataclass: ClassVar[type]
    _prefix: ClassVar[str]

    def to_dataclass(self) -> Any:
        """This section as its ``agentrl.trainer.config`` dataclass."""
        return self._dataclass(**{name: getattr(self, name) for name in type(self).model_fields})

    @model_validator(mode="after")
    def _check(self) -> _DataclassSection:
        as_value_error(lambda: self.to_dataclass().validate(prefix=self._prefix), "")
        return self


class _RolloutCorrectionBase(_DataclassSection):
    _dataclass: ClassVar[type] = _tc.RolloutCorrectionConfig
    _prefix: ClassVar[str] = "trainer.rollout_correction."


class _KLBase(_DataclassSection):
    _dataclass: ClassVar[type] = _tc.KLConfig
    _prefix: ClassVar[str] = "trainer.kl."

    @model_validator(mode="before")
    @classmethod
    def _estimator_by_mode(cls, data: Any) -> Any:
        """A missing or ``None`` estimator becomes the mode's (``KL_DEFAULT_ESTIMATORS``: k1
        for ``reward``, k3 for ``loss``), so the validated section, a dump of it and the
        trainer's ``KLConfig`` all name the estimator in use. A bad mode leaves it ``None``
        and is reported by its own field."""
        if not isinstance(data, dict) or data.get("estimator") is not None:
            return data
        mode = data.get("mode", _KL_DEFAULT_MODE)
        if isinstance(mode, str) and mode in _tc.KL_DEFAULT_ESTIMATORS:
            return {**data, "estimator": _tc.KL_DEFAULT_ESTIMATORS[mode]}
        return data


_KL_DEFAULT_MODE = next(f.default for f in dataclasses.fields(_tc.KLConfig) if f.name == "mode")

RolloutCorrectionSection = create_model(
    "RolloutCorrectionSection",
    __base__=_RolloutCorrectionBase,
    __module__=__name__,
    __doc__="""``trainer.rollout_correction``: ``agentrl.trainer.config.RolloutCorrectionConfig``.
    Importance weights and masks need the engine's log-probs of the distribution the
    trainer recomputes, so they refuse top-p / top-k sampling (a start-up ``ConfigError``).""",
    **_dataclass_fields(_tc.RolloutCorrectionConfig, ("is_level", "is_cap", "token_mask_band", "seq_mask_band")),
)

KLSection = create_model(
    "KLSection",
    __base__=_KLBase,
    __module__=__name__,
    __doc__="""``trainer.kl``: ``agentrl.trainer.config.KLConfig``, a KL penalty toward a frozen
    reference policy.""",
    **_dataclass_fields(_tc.KLConfig, ("coef", "mode", "estimator", "reference_path")),
)

TrainerSection = create_model(
    "TrainerSection",
    __base__=Section,
    __module__=__name__,
    __doc__="""The policy trainer (``agentrl.trainer.TrainerConfig``, built by ``trainer_configs``)
    and where it runs. Every field but ``num_ranks`` and ``backend`` is the dataclass field
    of the same name, with its type, default and documentation; the dataclass's
    ``validate`` checks them (``Config``'s cross-checks).""",
    **_dataclass_fields(
        _tc.TrainerConfig,
        ("lr", "weight_decay", "betas", "eps", "max_grad_norm", "warmup_steps", "ppo_epochs", "clip_ratio_low",
         "clip_ratio_high", "dual_clip_c", "loss_agg_mode", "rollout_correction", "kl", "row_layout",
         "micro_batch_tokens", "micro_batch_size", "logprob_chunk_tokens", "attn_implementation",
         "gradient_checkpointing", "num_ranks", "backend", "device"),
        own={
            "num_ranks": (int, Field(1, ge=1, description="FSDP2 ranks (trainer actors). CPU default 1: the 2 cores are shared with the engine.")),
            "backend": (Literal["gloo", "nccl"], Field("gloo", description="torch.distributed backend: gloo on CPU, nccl on GPUs.")),
        },
        notes={"device": "The critic runs on the same device."},
        sections={"rollout_correction": RolloutCorrectionSection, "kl": KLSection},
    ),
)

CriticSection = create_model(
    "CriticSection",
    __base__=Section,
    __module__=__name__,
    __doc__="""The value model, used when ``algorithm.advantage`` is ``turn_critic`` (a value per
    turn, read at the token before the turn's completion) or ``gae`` (a value per sampled
    token, read at the token before it). The same model and settings serve both
    (``agentrl.trainer.CriticConfig``, built by ``trainer_configs``); dtype, device and
    seed are the policy's. Every field but ``model_path`` is the dataclass field of the same
    name, with its type, default and documentation.""",
    **_dataclass_fields(
        _tc.CriticConfig,
        ("model_path", "lr", "weight_decay", "betas", "eps", "max_grad_norm", "warmup_steps", "epochs", "value_clip",
         "head_init_std", "micro_batch_size", "micro_batch_tokens", "gradient_checkpointing"),
        own={"model_path": (str | None, Field(None, description="Backbone of the value model (None: the policy's model, a scalar head on top)."))},
    ),
)


_SECTION_ONLY = {"trainer": ("num_ranks", "backend"), "critic": ("model_path",)}
"""Section fields that are not passed to the dataclass field of the same name:
``num_ranks`` / ``backend`` place the trainer; ``critic.model_path`` None means the
policy's model, resolved by ``trainer_configs``."""


def _dataclass_kwargs(section: BaseModel, skip: Sequence[str]) -> dict[str, Any]:
    """A section's fields by name (sub-sections as their dataclasses), minus ``skip``."""
    out = {}
    for name in type(section).model_fields:
        if name in skip:
            continue
        value = getattr(section, name)
        out[name] = value.to_dataclass() if hasattr(value, "to_dataclass") else value
    return out


def build_trainer_config(trainer: BaseModel, *, model_path: str, dtype: str, seed: int) -> _tc.TrainerConfig:
    """The policy trainer's ``TrainerConfig`` from a validated ``TrainerSection``: every
    field but ``num_ranks`` / ``backend``, plus ``model_path``, ``dtype`` (``model.dtype``)
    and ``seed`` (``run.seed``); the device is the section's."""
    kwargs = _dataclass_kwargs(trainer, _SECTION_ONLY["trainer"])
    kwargs.update({"dtype": dtype, "device": trainer.device, "seed": seed})
    return _tc.TrainerConfig(model_path=model_path, **kwargs)


def build_critic_config(critic: BaseModel, *, model_path: str, dtype: str, device: str, seed: int) -> _tc.CriticConfig:
    """The value model's ``CriticConfig`` from a validated ``CriticSection``: every field
    but ``model_path``, whose ``None`` becomes ``model_path`` (the policy's folder), plus
    the policy's ``dtype``, ``device`` (``trainer.device``) and ``seed``."""
    common = {"dtype": dtype, "device": device, "seed": seed}
    return _tc.CriticConfig(model_path=critic.model_path or model_path,
                            **_dataclass_kwargs(critic, _SECTION_ONLY["critic"]), **common)


def _vocab_size(folder: str, what: str) -> int:
    """``vocab_size`` from a Hugging Face folder's ``config.json`` (top level, or its
    ``text_config`` for multimodal models)."""
    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what}={folder!r}: cannot read its config.json ({exc}); expected a Hugging Face model folder") from None
    size = data.get("vocab_size")
    if size is None and isinstance(data.get("text_config"), dict):
        size = data["text_config"].get("vocab_size")
    if not isinstance(size, int):
        raise ConfigError(f"{what}={folder!r}: config.json has no integer vocab_size (got {size!r})")
    return size


def check_reference_vocab(policy_path: str, reference_path: str) -> None:
    """Refuse a KL reference model whose vocabulary differs from the policy's: the
    per-token log-probs of the two would score different token ids.

    Compares ``vocab_size`` of both folders' ``config.json`` (the trainer also compares the
    loaded embedding sizes).

    Raises:
        ConfigError: naming both paths and both sizes, or a folder without a readable
            ``config.json``.
    """
    ref = _vocab_size(reference_path, "trainer.kl.reference_path")
    pol = _vocab_size(policy_path, "model.path")
    if ref != pol:
        raise ConfigError(
            f"trainer.kl.reference_path={reference_path!r} has vocab_size={ref} but the policy "
            f"(model.path resolved to {policy_path!r}) has vocab_size={pol}; the reference must share the policy's vocabulary"
        )
