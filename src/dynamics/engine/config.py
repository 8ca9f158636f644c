"""The run configuration: typed, validated once, saved as YAML (docs/config.md lists every field).

Every field has a docstring-style description; ``RunConfig.from_yaml`` applies
``key=value`` overrides (dotted paths, values parsed as YAML scalars) before validation,
and every validation error names the offending field and how to fix it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dynamics.core.schedules import ScheduleError, build_schedule
from dynamics.engine.config_section import ConfigError, ConfigSection
from dynamics.engine.config_text import apply_overrides, format_validation_error, yaml_position
from dynamics.engine.dataset_config import DatasetConfig
from dynamics.engine.method_config import MethodConfig

# The config field behind each argument of build_schedule, for its errors.
SCHEDULE_FIELDS = {
    "spec": "method.schedule",
    "total_steps": "training.total_steps",
    "probe_cap": "method.probe_cap",
    "probe_min": "method.probe_min",
}


class QuantizationConfig(ConfigSection):
    bits: Literal[4, 8] = Field(
        ...,
        description="4: NF4 with double quantization and bfloat16 compute (QLoRA); 8: LLM.int8().",
    )


class ModelConfig(ConfigSection):
    name_or_path: str | None = Field(None, description="Hub id or local folder of a causal LM.")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    dtype: Literal["auto", "float64", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Weights dtype; 'auto' is float32 on CPU and bfloat16 on GPUs that support it. float64 "
        "makes a run's numbers the same on CPUs with different vector instructions, at about twice "
        "float32's time and memory.",
    )
    trust_remote_code: bool = Field(
        False, description="Run model code from the hub repo. Off unless you trust it."
    )
    init_config: dict[str, Any] | None = Field(
        None,
        description="Instead of loading weights, build a randomly initialised model from this "
        "transformers config dict (needs 'model_type'); used by tests and the demo.",
    )
    tokenizer: str | None = Field(
        None, description="Tokenizer hub id or folder (default: the model's)."
    )
    attn_implementation: (
        Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"] | None
    ) = Field(
        None,
        description="Attention kernel (transformers' attn_implementation); null is transformers' default "
        "(sdpa where the model supports it). flash_attention_2/3 need a CUDA GPU and the flash-attn package.",
    )
    quantization: QuantizationConfig | None = Field(
        None,
        description="Load the base weights quantized through bitsandbytes and train a LoRA adapter on them "
        "(QLoRA): {bits: 4} is NF4 with double quantization and bfloat16 compute, {bits: 8} is LLM.int8(). "
        "Needs lora, model.name_or_path, a CUDA GPU and the bitsandbytes package (pip install "
        "'dynamics[qlora]'); null loads the weights in model.dtype.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.name_or_path is not None and self.init_config is not None:
            raise ValueError(
                "set only one of model.name_or_path (a hub id or folder) or model.init_config"
            )
        # Neither: the model is passed in Python (dynamics.run(config, model=..., tokenizer=...)),
        # which preflight checks.
        if self.init_config is not None and "model_type" not in self.init_config:
            raise ValueError("model.init_config needs a 'model_type' key, e.g. 'llama'")
        if self.init_config is not None and not isinstance(self.init_config["model_type"], str):
            raise ValueError(
                "model.init_config.model_type must be a transformers model type name, e.g. 'llama'"
            )
        if self.init_config is not None and not _all_finite(self.init_config):
            raise ValueError("model.init_config holds NaN or infinity; give finite numbers")
        if self.init_config is not None and self.tokenizer is None:
            raise ValueError(
                "model.tokenizer is required with model.init_config (a tokenizer folder or hub id)"
            )
        if self.quantization is not None and self.init_config is not None:
            raise ValueError(
                "model.quantization quantizes weights loaded from model.name_or_path; a model built from "
                "model.init_config has none to load: remove model.quantization"
            )
        return self


class LoraConfig(ConfigSection):
    rank: int = Field(32, ge=1, description="LoRA rank r (the paper uses 32).")
    alpha: float = Field(64.0, gt=0, description="LoRA scaling alpha.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names to adapt, or 'all-linear'."
    )


class OptimizerConfig(ConfigSection):
    lr: float = Field(1e-4, gt=0, description="Peak learning rate (paper: 1e-4 for Qwen2.5-3B).")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="LR schedule; constant by default since the paper uses no warmup."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps before the schedule.")
    max_grad_norm: float | None = Field(
        None, gt=0, description="Clip the gradient norm (off when null)."
    )

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(
                f"each AdamW beta must lie in [0, 1), got {list(betas)}; the default is [0.9, 0.999]"
            )
        return betas


class TrainingConfig(ConfigSection):
    total_steps: int = Field(2048, ge=1, description="Optimizer steps of the main run.")
    batch_size: int = Field(8, ge=1, description="Sequences per micro-batch (per process).")
    gradient_accumulation: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    sequence_length: int = Field(512, ge=8, description="Tokens per sequence (truncate or pack).")
    packing: bool | Literal["per-document"] = Field(
        False,
        description="Pack documents into full sequences instead of truncating them: true lets packed documents "
        "attend to each other; 'per-document' restarts positions at each document and keeps attention within it "
        "(no attention mask; every attn_implementation).",
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no", description="Mixed precision through accelerate (GPU only; CPU runs in fp32)."
    )
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")
    seed: int = Field(
        0, ge=0, description="Seed of the training data order, mixture sampling and initialisation."
    )
    data_seed: int = Field(
        0,
        ge=0,
        description="Seed of the eval/test splits and of the fixed evaluation batches, kept apart from seed so "
        "that runs with different seeds are scored on the same rows.",
    )
    max_skipped_steps: int = Field(
        8,
        ge=0,
        description="Main-run steps with a non-finite loss or gradient that are skipped (never applied) "
        "before the run stops as diverged.",
    )
    split_probes: bool = Field(
        True,
        description="Under several processes, each process probes its own share of the fine-tuning datasets "
        "(when the process count divides their number) instead of every process taking part in every probe.",
    )
    checkpoint_interval: int | None = Field(
        None,
        ge=0,
        description="Save the full training state to last_checkpoint/ every this many steps, for --resume "
        "(null: at every main evaluation; 0: never).",
    )
    sampling: Literal["batches", "tokens"] = Field(
        "batches",
        description="What the mixture weights are shares of: batches (each batch is drawn from dataset j with "
        "probability w_j) or tokens (dataset j is drawn with probability proportional to w_j over its mean "
        "non-padding tokens per batch, so that over the run it gets a share w_j of the trained tokens). The "
        "solver predicts and chooses batch shares either way; under tokens, method.weights and the records' "
        "weights are token shares, and each update also records the batch shares it trains (extra.batch_shares).",
    )


class EvaluationConfig(ConfigSection):
    interval: int = Field(
        64, ge=1, description="Main evaluation every this many steps (paper: 64)."
    )
    batches: int = Field(
        200, ge=1, description="Batches per domain in a main evaluation (paper: 200)."
    )
    reduced_batches: int = Field(
        50,
        ge=1,
        description="Batches per domain in a probe's evaluation, the first of the main ones (paper: 50).",
    )
    batch_size: int | None = Field(
        None, ge=1, description="Evaluation batch size (default: training.batch_size)."
    )
    relative_noise: float = Field(
        0.0,
        ge=0,
        description="A sensitivity check, not for training: multiply every evaluated value (probes' too) by "
        "1 + this x N(0, 1), e.g. 1e-6, the size of what separates two machines (0: off).",
    )
    noise_seed: int = Field(0, ge=0, description="Seed of relative_noise's draws.")
    selection_margin: float = Field(
        0.0,
        ge=0,
        description="Checkpoint selection: prefer the feasible checkpoints whose every constraint clears its "
        "reference on the eval split by this many standard errors of its change, measured batch by batch; "
        "where none does, the best feasible one (0: the best feasible checkpoint, the paper's choice). On 8 "
        "eval batches few checkpoints clear 2 errors and it kept no more constraints on the test split "
        "(benchmarks/results/beyond-the-paper-notebook.md); more evaluation.batches narrow the errors themselves.",
    )

    @model_validator(mode="after")
    def _reduced_subset(self) -> EvaluationConfig:
        if self.reduced_batches > self.batches:
            raise ValueError(
                f"evaluation.reduced_batches ({self.reduced_batches}) must not exceed evaluation.batches "
                f"({self.batches}): the reduced evaluation is a subset of the main one"
            )
        return self


class RunConfig(ConfigSection):
    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="The base model; may be left out when dynamics.run is given the model object.",
    )
    lora: LoraConfig | None = Field(
        default_factory=LoraConfig, description="LoRA settings; null = full fine-tuning."
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    method: MethodConfig = Field(default_factory=MethodConfig)
    datasets: list[DatasetConfig] = Field(..., min_length=1)
    output_dir: str = Field(
        "runs/run", description="Run folder (created; must be empty or absent)."
    )
    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        description="Experiment trackers (through accelerate; each needs its package installed). They receive "
        "every main evaluation, weight update, probe time and the training loss and learning rate.",
    )
    tracker_project: str = Field(
        "dynamics",
        min_length=1,
        description="Tracker project (TensorBoard: the subfolder of output_dir it writes).",
    )
    tracker_run_name: str | None = Field(
        None, description="Run name in W&B and MLflow (default: output_dir's name)."
    )

    @field_validator("datasets")
    @classmethod
    def _unique_names(cls, datasets: list[DatasetConfig]) -> list[DatasetConfig]:
        names = [d.name for d in datasets]
        for name in dict.fromkeys(n for n in names if names.count(n) > 1):
            roles = sorted({d.role for d in datasets if d.name == name})
            if "target" in roles and "constraint" in roles:
                raise ValueError(
                    f"dataset {name!r} is listed as both target and constraint: a constraint is held-out "
                    "data the run must not get worse on, so it cannot be trained on; rename one and give "
                    "the constraint other data"
                )
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(
                f"dataset names must be unique, repeated: {dupes}; rename or remove the copies"
            )
        seen: dict[tuple[str | None, ...], DatasetConfig] = {}
        for d in datasets:
            if d.path is None and d.hub_id is None:
                continue  # rows passed in Python: nothing here says where they come from
            first = seen.setdefault(_source_key(d), d)
            if first is d:
                continue
            where = f"file {d.path}" if d.path is not None else f"hub dataset {d.hub_id}"
            where += f", config {d.config_name}" if d.config_name else ""
            where += f", split {d.split}"
            if {first.role, d.role} == {"target", "constraint"}:
                raise ValueError(
                    f"datasets {first.name!r} ({first.role}) and {d.name!r} ({d.role}) read the same data "
                    f"({where}): a constraint is held-out data the run must not get worse on, so it cannot "
                    "also be a target; give the constraint another file or split"
                )
            raise ValueError(
                f"datasets {first.name!r} and {d.name!r} read the same data ({where}); list it once "
                "(use budget to take more or fewer rows)"
            )
        return datasets

    @model_validator(mode="after")
    def _roles_and_method(self) -> RunConfig:
        roles = [d.role for d in self.datasets]
        if "target" not in roles:
            raise ValueError("datasets: at least one dataset needs role 'target'")
        training_names = [d.name for d in self.datasets if d.role != "constraint"]
        try:
            build_schedule(
                self.method.schedule,
                self.training.total_steps,
                self.method.probe_cap,
                self.method.probe_min,
            )
        except ScheduleError as err:
            raise ValueError(f"{SCHEDULE_FIELDS[err.argument]}: {err}") from None
        floor, num_trained = self.method.floors.all, len(training_names)
        if floor * num_trained > 1.0 + 1e-12:
            raise ValueError(
                f"method.floors.all ({floor:g}) times the {num_trained} training datasets is "
                f"{floor * num_trained:g}, more than the whole mixture: lower it to at most {1 / num_trained:g}"
            )
        target_floor, num_targets = self.method.target_floor, roles.count("target")
        num_others = num_trained - num_targets
        held = target_floor * num_targets + floor * num_others
        if target_floor > floor and held >= 1.0:  # at or below floors.all it adds nothing
            raise ValueError(
                f"method.floors.targets ({target_floor:g}) for each of the {num_targets} target "
                f"datasets, with method.floors.all for the others, holds {held:g} of the "
                f"mixture: lower it below {(1 - floor * num_others) / num_targets:g}"
            )
        if self.method.name == "fixed":
            if not self.method.weights:
                raise ValueError(
                    "method.weights: the fixed method needs a weight per training dataset"
                )
            unknown = sorted(set(self.method.weights) - set(training_names))
            missing = sorted(set(training_names) - set(self.method.weights))
            if unknown or missing:
                raise ValueError(
                    f"method.weights must name each training dataset once: unknown {unknown}, missing {missing}"
                )
            if (
                any(w < 0 for w in self.method.weights.values())
                or sum(self.method.weights.values()) <= 0
            ):
                raise ValueError(
                    f"method.weights must be >= 0 with a positive sum (they are normalised), got {self.method.weights}"
                )
            total = sum(self.method.weights.values())
            # Token shares become batch shares with the data's lengths: build_policy checks those.
            by_batches = self.training.sampling == "batches"
            below = sorted(
                n
                for n, w in self.method.weights.items()
                if by_batches and w / total < floor - 1e-12
            )
            if below:
                raise ValueError(
                    f"method.weights give {below} less than method.floors.all ({floor:g}) once "
                    "normalised: raise their weights or lower method.floors.all"
                )
        elif self.method.weights is not None:
            raise ValueError(
                "method.weights is only used by the fixed method; remove it or set method.name: fixed"
            )
        if self.method.name == "gradient-alignment":
            accuracy = [d.name for d in self.datasets if d.metric == "accuracy"]
            if accuracy:
                raise ValueError(
                    f"method.name gradient-alignment cannot keep accuracy constraints {accuracy}: its slopes "
                    "are gradient dot products of a differentiable stand-in, not changes in accuracy, so "
                    "they cannot be compared with the accuracy slack; use method.name: dynamics (or "
                    "fixed), or remove those constraints"
                )
            if self.method.alignment_batches > self.evaluation.batches:
                raise ValueError(
                    f"method.alignment_batches ({self.method.alignment_batches}) must not exceed "
                    f"evaluation.batches ({self.evaluation.batches}): the domain gradients average the first "
                    "eval batches; lower method.alignment_batches or raise evaluation.batches"
                )
        if self.method.name == "fixed" and self.method.backtrack:
            raise ValueError(
                "method.backtrack re-decides the mixture, which fixed weights never do; remove it or "
                "set method.name: dynamics"
            )
        return self

    # --- views in the paper's terms -------------------------------------------------
    @property
    def training_datasets(self) -> list[DatasetConfig]:
        """The N fine-tuning datasets (targets and non-targets), in weight-vector order."""
        return [d for d in self.datasets if d.role != "constraint"]

    @property
    def evaluation_domains(self) -> list[DatasetConfig]:
        """The M evaluation domains: targets, then constraints (T ∪ C)."""
        return [d for d in self.datasets if d.role == "target"] + [
            d for d in self.datasets if d.role == "constraint"
        ]

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> RunConfig:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"config file {path} cannot be read: {err}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not valid YAML{yaml_position(err)}") from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path} must hold a mapping of config sections (model, datasets, ...)"
            )
        return cls.from_dict(data, overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any], overrides: list[str] | None = None) -> RunConfig:
        data = apply_overrides(data, overrides or [])
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err)) from None

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _all_finite(value: Any) -> bool:
    """No NaN or infinity anywhere in a nested value (the saved YAML could not keep them)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_all_finite(v) for v in value)
    return True


def _source_key(dataset: DatasetConfig) -> tuple[str | None, ...]:
    """What identifies a dataset's rows: the file (as an absolute path) or hub id, its
    configuration and the split (two slices of one split are different data)."""
    path = (
        None
        if dataset.path is None
        else os.path.normpath(os.path.abspath(os.path.expanduser(dataset.path)))
    )
    return (path, dataset.hub_id, dataset.config_name, dataset.split.replace(" ", ""))
