"""TrainerConfig validation: every bad value is named in a ConfigError."""

from __future__ import annotations

import dataclasses

import pytest

from agentrl.errors import ConfigError
from agentrl.trainer import TrainerConfig


def test_defaults_are_valid() -> None:
    cfg = TrainerConfig(model_path="/some/model")
    cfg.validate()
    assert cfg.dtype == "float32" and cfg.device == "cpu" and cfg.loss_agg_mode == "token-mean"
    assert cfg.clip_ratio_low == 0.2 and cfg.clip_ratio_high == 0.2 and cfg.temperature is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model_path", "", "model_path=''"),
        ("dtype", "float16", "dtype='float16'"),
        ("device", "tpu", "device='tpu'"),
        ("lr", 0.0, "lr=0.0"),
        ("weight_decay", -0.1, "weight_decay=-0.1"),
        ("betas", (0.9, 1.0), r"betas=\(0.9, 1.0\)"),
        ("eps", 0.0, "eps=0.0"),
        ("max_grad_norm", 0.0, "max_grad_norm=0.0"),
        ("warmup_steps", -1, "warmup_steps=-1"),
        ("micro_batch_size", 0, "micro_batch_size=0"),
        ("micro_batch_tokens", 0, "micro_batch_tokens=0"),
        ("ppo_epochs", 0, "ppo_epochs=0"),
        ("clip_ratio_low", 1.0, "clip_ratio_low=1.0"),
        ("clip_ratio_high", -0.2, "clip_ratio_high=-0.2"),
        ("loss_agg_mode", "sum", "loss_agg_mode='sum'"),
        ("temperature", 0.0, "temperature=0.0"),
        ("logprob_chunk_tokens", 0, "logprob_chunk_tokens=0"),
        ("seed", 1.5, "seed=1.5"),
        ("dual_clip_c", 1.0, "dual_clip_c=1.0; expected a finite number > 1"),
        ("dual_clip_c", float("inf"), "dual_clip_c=inf"),
        ("row_layout", "ragged", "row_layout='ragged'"),
        ("attn_implementation", "flash3", "attn_implementation='flash3'"),
        ("rollout_correction", {"is_level": "token"}, "rollout_correction=.*expected a RolloutCorrectionConfig"),
        ("kl", None, "kl=None; expected a KLConfig"),
    ],
)
def test_invalid_field_is_named(field: str, value: object, message: str) -> None:
    cfg = dataclasses.replace(TrainerConfig(model_path="/some/model"), **{field: value})
    with pytest.raises(ConfigError, match=message):
        cfg.validate()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"is_level": "turn"}, "rollout_correction.is_level='turn'"),
        ({"is_cap": 0.99}, r"rollout_correction.is_cap=0.99; expected a finite number >= 1"),
        ({"is_cap": float("nan")}, "rollout_correction.is_cap=nan"),
        ({"token_mask_band": (2.0, 0.5)}, r"token_mask_band=\(2.0, 0.5\): low=2.0 > high=0.5"),
        ({"token_mask_band": (0.0, 2.0)}, r"token_mask_band=\(0.0, 2.0\); expected 0 < low <= 1 <= high"),
        ({"seq_mask_band": (1.01, 1.02)}, r"seq_mask_band=\(1.01, 1.02\); expected 0 < low <= 1 <= high"),
        ({"seq_mask_band": (0.5,)}, r"seq_mask_band=\(0.5,\); expected a pair"),
        ({"seq_mask_band": (0.5, float("inf"))}, "seq_mask_band=.*finite"),
    ],
)
def test_rollout_correction_bad_values_are_named(kwargs: dict, message: str) -> None:
    from agentrl.trainer.config import RolloutCorrectionConfig

    cfg = TrainerConfig(model_path="m", rollout_correction=RolloutCorrectionConfig(**kwargs))
    with pytest.raises(ConfigError, match=message):
        cfg.validate()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"coef": -0.1}, r"kl.coef=-0.1; expected a finite number >= 0"),
        ({"estimator": "k4"}, "kl.estimator='k4'"),
        ({"mode": "advantage"}, "kl.mode='advantage'"),
        ({"reference_path": ""}, "kl.reference_path=''"),
    ],
)
def test_kl_bad_values_are_named(kwargs: dict, message: str) -> None:
    from agentrl.trainer.config import KLConfig

    with pytest.raises(ConfigError, match=message):
        TrainerConfig(model_path="m", kl=KLConfig(**kwargs)).validate()


def test_kl_in_reward_mode_with_coef_zero_and_bands_that_hold_one_are_valid() -> None:
    from agentrl.trainer.config import KLConfig, RolloutCorrectionConfig

    cfg = TrainerConfig(
        model_path="m",
        kl=KLConfig(coef=0.0, mode="reward"),
        rollout_correction=RolloutCorrectionConfig(
            is_level="sequence", is_cap=1.0, token_mask_band=(1.0, 1.0), seq_mask_band=(0.5, 2.0)
        ),
    )
    cfg.validate()
    assert cfg.rollout_correction.enabled and not TrainerConfig(model_path="m").rollout_correction.enabled


def test_flash_attention_needs_cuda_and_bf16_naming_both_values() -> None:
    with pytest.raises(ConfigError, match="attn_implementation='flash_attention_2' with device='cpu', dtype='float32'"):
        TrainerConfig(model_path="m", attn_implementation="flash_attention_2").validate()
    with pytest.raises(ConfigError, match="device='cuda', dtype='float32'"):
        TrainerConfig(model_path="m", attn_implementation="flash_attention_2", device="cuda").validate()
    TrainerConfig(model_path="m", attn_implementation="flash_attention_2", device="cuda", dtype="bfloat16").validate()


def test_critic_accepts_only_the_hugging_face_kernels() -> None:
    from agentrl.trainer import CriticConfig

    with pytest.raises(ConfigError, match="attn_implementation='auto'"):
        CriticConfig(model_path="m", attn_implementation="auto").validate()


def test_every_dataclass_field_is_documented() -> None:
    from agentrl.trainer.config import CriticConfig, KLConfig, RolloutCorrectionConfig, field_doc

    for cls in (TrainerConfig, CriticConfig, RolloutCorrectionConfig, KLConfig):
        for f in dataclasses.fields(cls):
            doc = field_doc(cls, f.name)
            assert len(doc) > 20 and doc.strip() == doc, (cls.__name__, f.name, doc)
    # the packed budget and the padded cap are one field with two documented meanings
    doc = field_doc(TrainerConfig, "micro_batch_tokens")
    assert "packed layout" in doc and "padded layout" in doc
    assert field_doc(CriticConfig, "lr") != field_doc(TrainerConfig, "lr")  # each class its own text


def test_optional_fields_accept_none() -> None:
    cfg = TrainerConfig(model_path="m", max_grad_norm=None, micro_batch_tokens=None, temperature=None, dual_clip_c=None)
    cfg.validate()  # None means "off" (no clipping, the layout's default budget, the batch's own temperature, no dual clip)
    assert (cfg.max_grad_norm, cfg.micro_batch_tokens, cfg.temperature, cfg.dual_clip_c) == (None, None, None, None)


_SHARED = [
    ("model_path", "", "model_path=''"), ("dtype", "float16", "dtype='float16'"), ("device", "tpu", "device='tpu'"),
    ("lr", 0.0, "lr=0.0"), ("weight_decay", -0.1, "weight_decay=-0.1"), ("betas", (0.9, 1.0), r"betas=\(0.9, 1.0\)"),
    ("eps", 0.0, "eps=0.0"), ("max_grad_norm", 0.0, "max_grad_norm=0.0"), ("warmup_steps", -1, "warmup_steps=-1"),
    ("micro_batch_size", 0, "micro_batch_size=0"), ("micro_batch_tokens", 0, "micro_batch_tokens=0"),
    ("seed", 1.5, "seed=1.5"),
]


@pytest.mark.parametrize(("field", "value", "message"), _SHARED)
def test_critic_config_checks_the_shared_fields_the_same_way(field: str, value: object, message: str) -> None:
    from agentrl.trainer import CriticConfig

    cfg = dataclasses.replace(CriticConfig(model_path="/some/model"), **{field: value})
    with pytest.raises(ConfigError, match=message):
        cfg.validate()
    CriticConfig(model_path="/some/model").validate()


# ---------------------------------------------------------------- from the run config


_TRAINER_OVERRIDES = {
    "lr": ("2e-6", 2e-6), "weight_decay": ("0.01", 0.01), "betas": ("[0.8,0.95]", (0.8, 0.95)),
    "eps": ("1e-6", 1e-6), "max_grad_norm": ("0.5", 0.5), "warmup_steps": ("3", 3), "ppo_epochs": ("2", 2),
    "clip_ratio_low": ("0.1", 0.1), "clip_ratio_high": ("0.28", 0.28), "dual_clip_c": ("4.0", 4.0),
    "loss_agg_mode": ("seq-mean-token-mean", "seq-mean-token-mean"), "row_layout": ("padded", "padded"),
    "micro_batch_tokens": ("512", 512), "micro_batch_size": ("2", 2), "logprob_chunk_tokens": ("64", 64),
    "attn_implementation": ("eager", "eager"), "gradient_checkpointing": ("true", True),
    "rollout_correction.is_level": ("sequence", "sequence"), "rollout_correction.is_cap": ("3.0", 3.0),
    "rollout_correction.token_mask_band": ("[0.5,2.0]", (0.5, 2.0)),
    "rollout_correction.seq_mask_band": ("[0.9,1.1]", (0.9, 1.1)),
    "kl.coef": ("0.05", 0.05), "kl.estimator": ("k2", "k2"), "kl.mode": ("reward", "reward"),
    "kl.reference_path": (None, None),  # set below: it must be a folder with a config.json
    "device": ("cpu", "cpu"),  # the only device without a GPU; its mapping is checked with the common fields
}
_CRITIC_OVERRIDES = {
    "lr": ("3e-5", 3e-5), "weight_decay": ("0.02", 0.02), "betas": ("[0.85,0.99]", (0.85, 0.99)),
    "eps": ("1e-7", 1e-7), "max_grad_norm": ("2.0", 2.0), "warmup_steps": ("1", 1), "epochs": ("2", 2),
    "value_clip": ("0.5", 0.5), "head_init_std": ("0.02", 0.02), "micro_batch_size": ("8", 8),
    "micro_batch_tokens": ("256", 256), "gradient_checkpointing": ("true", True),
    "model_path": ("/models/critic", "/models/critic"),
}


def _section_keys(section: type, prefix: str = "") -> set[str]:
    """Every leaf key of a run-config section (sub-sections flattened with dots)."""
    from pydantic import BaseModel

    keys = set()
    for name, info in section.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys |= _section_keys(ann, f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def _tiny_hf_folder(path, vocab_size: int) -> str:
    import json

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size}))
    return str(path)


def test_trainer_configs_maps_every_section_field(tmp_path) -> None:
    """Every run-config trainer / critic field reaches the dataclass field of the same name
    through trainer_configs (each set to a non-default value here, so a field that is
    dropped or mis-mapped fails; a new field without an entry here fails too)."""
    from agentrl.config import CriticSection, TrainerSection, load_config, trainer_configs
    from agentrl.trainer import CriticConfig
    from agentrl.trainer.config import KLConfig, RolloutCorrectionConfig

    assert _section_keys(TrainerSection) - {"num_ranks", "backend"} == set(_TRAINER_OVERRIDES)
    assert _section_keys(CriticSection) == set(_CRITIC_OVERRIDES)
    policy_dir = _tiny_hf_folder(tmp_path / "policy", 256)
    ref_dir = _tiny_hf_folder(tmp_path / "ref", 256)
    overrides = ["run.seed=7", "model.dtype=bfloat16", "algorithm.advantage=gae", f"trainer.kl.reference_path={ref_dir}"]
    overrides += [f"trainer.{k}={raw}" for k, (raw, _) in _TRAINER_OVERRIDES.items() if raw is not None]
    overrides += [f"critic.{k}={raw}" for k, (raw, _) in _CRITIC_OVERRIDES.items()]
    policy, critic = trainer_configs(load_config(None, overrides), policy_dir)

    want: dict = {k: v for k, (_, v) in _TRAINER_OVERRIDES.items() if "." not in k}
    assert policy == TrainerConfig(
        model_path=policy_dir, dtype="bfloat16", seed=7, **want,
        rollout_correction=RolloutCorrectionConfig(
            is_level="sequence", is_cap=3.0, token_mask_band=(0.5, 2.0), seq_mask_band=(0.9, 1.1)
        ),
        kl=KLConfig(coef=0.05, estimator="k2", mode="reward", reference_path=ref_dir),
    )
    want_c = {k: v for k, (_, v) in _CRITIC_OVERRIDES.items()}
    assert critic == CriticConfig(dtype="bfloat16", device="cpu", seed=7, **want_c)
    policy.validate()
    critic.validate()


def test_run_config_descriptions_are_the_dataclass_docs() -> None:
    """One source of documentation: every run-config field that is a dataclass field carries
    the dataclass's text (the run config may append a note), sub-sections included."""
    from agentrl.config import CriticSection, KLSection, RolloutCorrectionSection, TrainerSection
    from agentrl.trainer import CriticConfig
    from agentrl.trainer.config import KLConfig, RolloutCorrectionConfig, field_doc

    pairs = [(TrainerSection, TrainerConfig), (CriticSection, CriticConfig),
             (RolloutCorrectionSection, RolloutCorrectionConfig), (KLSection, KLConfig)]
    own = {(CriticSection, "model_path")}  # None there means "the policy's model": the run config's own text
    checked = 0
    for section, cls in pairs:
        names = {f.name for f in dataclasses.fields(cls)}
        for name, info in section.model_fields.items():
            if name not in names or (section, name) in own:
                continue
            assert info.description and info.description.startswith(field_doc(cls, name)), (section.__name__, name)
            if info.default_factory is None:  # the same default in both layers
                assert info.default == next(f.default for f in dataclasses.fields(cls) if f.name == name), name
            checked += 1
    assert checked >= 35


def test_trainer_configs_defaults_match_the_dataclass_defaults() -> None:
    """An empty run config trains with the dataclasses' own defaults (except the run's
    seed and dtype), and without a critic unless the estimator needs one."""
    from agentrl.config import load_config, trainer_configs
    from agentrl.trainer import CriticConfig, TrainerConfig

    policy, critic = trainer_configs(load_config(None), "m")
    assert critic is None
    assert policy == TrainerConfig(model_path="m")
    _, critic = trainer_configs(load_config(None, ["algorithm.advantage=turn_critic", "critic.model_path=c"]), "m")
    assert critic == CriticConfig(model_path="c")


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.clip_ratio_low=1.0", "clip_ratio_low=1.0; expected 0 <= value < 1"),
    ("trainer.clip_ratio_high=-0.2", "clip_ratio_high=-0.2; expected >= 0"),
])
def test_run_config_checks_clip_ratios_with_the_trainer_check(override: str, message: str) -> None:
    from agentrl.config import load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.rollout_correction.is_level=token", "rollout.top_p=0.9"],
     r"trainer.rollout_correction \(is_level='token', token_mask_band=None, seq_mask_band=None\) with "
     r"rollout.top_p=0.9, rollout.top_k=-1"),
    (["trainer.rollout_correction.seq_mask_band=[0.9,1.1]", "rollout.top_k=20"],
     r"seq_mask_band=\(0.9, 1.1\)\) with rollout.top_p=1.0, rollout.top_k=20"),
    (["trainer.rollout_correction.token_mask_band=[2.0,0.5]"],
     r"trainer.rollout_correction.token_mask_band=\(2.0, 0.5\): low=2.0 > high=0.5"),
    (["trainer.rollout_correction.is_cap=0.5"], "trainer.rollout_correction.is_cap=0.5; expected a finite number >= 1"),
    (["trainer.kl.coef=-0.01"], "trainer.kl.coef=-0.01; expected a finite number >= 0"),
    (["trainer.dual_clip_c=0.9"], "trainer.dual_clip_c=0.9; expected a finite number > 1"),
    (["trainer.attn_implementation=flash_attention_2"],
     "trainer.attn_implementation='flash_attention_2' with trainer.device='cpu', model.dtype='float32'"),
    (["trainer.betas=[0.9,1.0]"], r"trainer.betas=\(0.9, 1.0\); expected two values in \[0, 1\)"),
    (["critic.betas=[1.5,0.9]"], r"critic.betas=\(1.5, 0.9\)"),
])
def test_run_config_refuses_contradicting_settings_naming_both_values(overrides: list[str], message: str) -> None:
    from agentrl.config import load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_run_config_accepts_kl_in_reward_mode_at_coef_zero_and_no_dual_clip() -> None:
    from agentrl.config import load_config, trainer_configs

    cfg = load_config(None, ["trainer.kl.mode=reward", "trainer.kl.coef=0", "trainer.dual_clip_c=null",
                             "trainer.max_grad_norm=null", "trainer.micro_batch_tokens=null"])
    policy, _ = trainer_configs(cfg, "m")
    assert (policy.kl.mode, policy.kl.coef, policy.dual_clip_c, policy.max_grad_norm, policy.micro_batch_tokens) == (
        "reward", 0.0, None, None, None)


def test_reference_model_with_another_vocabulary_is_refused_naming_both(tmp_path) -> None:
    from agentrl.config import check_reference_vocab, load_config, trainer_configs

    policy_dir = _tiny_hf_folder(tmp_path / "policy", 49152)
    other = _tiny_hf_folder(tmp_path / "other", 32000)
    cfg = load_config(None, ["trainer.kl.coef=0.01", f"trainer.kl.reference_path={other}"])
    with pytest.raises(ConfigError, match=r"reference_path=.*other' has vocab_size=32000 but the policy .* has vocab_size=49152"):
        trainer_configs(cfg, policy_dir)
    same = _tiny_hf_folder(tmp_path / "same", 49152)
    policy, _ = trainer_configs(load_config(None, ["trainer.kl.coef=0.01", f"trainer.kl.reference_path={same}"]), policy_dir)
    assert policy.kl.reference_path == same
    with pytest.raises(ConfigError, match=r"reference_path='.*missing': cannot read its config.json"):
        check_reference_vocab(policy_dir, str(tmp_path / "missing"))
    # a multimodal config keeps the text model's vocabulary under text_config
    import json

    (tmp_path / "mm").mkdir()
    (tmp_path / "mm" / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 49152}}))
    check_reference_vocab(policy_dir, str(tmp_path / "mm"))
