"""The run configuration: typed, validated once, saved as YAML (docs/config.md lists every
field).

``RunConfig`` holds the sections (``dynamics.engine.config_sections``, the method's
``dynamics.engine.method_config`` and the datasets' ``dynamics.engine.dataset_config``) and
checks them against each other. Every field has a docstring-style description;
``RunConfig.from_yaml`` applies ``key=value`` overrides (dotted paths, values parsed as YAML
scalars) before validation, and every validation error names the offending field and how to
fix it. Below the edge that validates it, the parts of a run receive the sections they use.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from dynamics.core.rules import DEFAULT_VARIANT, SELECTION_MARGINS
from dynamics.core.schedules import ScheduleError, build_schedule
from dynamics.engine.config_sections import (
    ConfigError,
    ConfigSection,
    EvaluationConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    QuantizationConfig,
    TrainingConfig,
)
from dynamics.engine.config_text import apply_overrides, format_validation_error, yaml_position
from dynamics.engine.dataset_config import DatasetConfig
from dynamics.engine.method_config import MethodConfig

# What other modules import from here, the sections included.
__all__ = [
    "ConfigError",
    "ConfigSection",
    "DatasetConfig",
    "EvaluationConfig",
    "LoraConfig",
    "MethodConfig",
    "ModelConfig",
    "OptimizerConfig",
    "QuantizationConfig",
    "RunConfig",
    "TrainingConfig",
    "apply_overrides",
    "format_validation_error",
]

# The config field behind each argument of build_schedule, for its errors.
SCHEDULE_FIELDS = {
    "spec": "method.schedule",
    "total_steps": "training.total_steps",
    "probe_cap": "method.probe_cap",
    "probe_min": "method.probe_min",
}


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
        description="Experiment trackers (through accelerate; each needs its package installed). "
        "They receive "
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
                    f"dataset {name!r} is listed as both target and constraint: a constraint is "
                    "held-out data the run must not get worse on, so it cannot be trained on; "
                    "rename one and give the constraint other data"
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
                    f"datasets {first.name!r} ({first.role}) and {d.name!r} ({d.role}) read the "
                    f"same data ({where}): a constraint is held-out data the run must not get "
                    "worse on, so it cannot also be a target; give the constraint another file or "
                    "split"
                )
            raise ValueError(
                f"datasets {first.name!r} and {d.name!r} read the same data ({where}); list it "
                "once (use budget to take more or fewer rows)"
            )
        return datasets

    @model_validator(mode="before")
    @classmethod
    def _method_selection_margin(cls, data: Any) -> Any:
        """An unset ``evaluation.selection_margin`` is the method's (:data:`SELECTION_MARGINS`),
        written out so that the saved config says how the run chose its checkpoint."""
        if not isinstance(data, dict):
            return data
        evaluation = data.get("evaluation", {})
        if isinstance(evaluation, EvaluationConfig):
            if evaluation.selection_margin is not None:
                return data
            filled: Any = evaluation.model_copy(
                update={"selection_margin": _method_margin(data.get("method", {}))}
            )
        elif isinstance(evaluation, dict) and evaluation.get("selection_margin") is None:
            filled = {**evaluation, "selection_margin": _method_margin(data.get("method", {}))}
        else:
            return data
        return {**data, "evaluation": filled}

    @model_validator(mode="after")
    def _roles_and_method(self) -> RunConfig:
        """The datasets' roles, the schedule and the method's settings against each other."""
        roles = [d.role for d in self.datasets]
        if "target" not in roles:
            raise ValueError("datasets: at least one dataset needs role 'target'")
        self._check_method_weights()
        self._check_method_fits()
        self._check_schedule_and_floors(roles)
        return self

    def _check_schedule_and_floors(self, roles: Sequence[str]) -> None:
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
                f"{floor * num_trained:g}, more than the whole mixture: lower it to at most "
                f"{1 / num_trained:g}"
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

    def _check_method_weights(self) -> None:
        training_names = [d.name for d in self.datasets if d.role != "constraint"]
        floor = self.method.floors.all
        if self.method.name == "fixed":
            if not self.method.weights:
                raise ValueError(
                    "method.weights: the fixed method needs a weight per training dataset"
                )
            unknown = sorted(set(self.method.weights) - set(training_names))
            missing = sorted(set(training_names) - set(self.method.weights))
            if unknown or missing:
                raise ValueError(
                    f"method.weights must name each training dataset once: unknown {unknown}, "
                    f"missing {missing}"
                )
            if (
                any(w < 0 for w in self.method.weights.values())
                or sum(self.method.weights.values()) <= 0
            ):
                raise ValueError(
                    "method.weights must be >= 0 with a positive sum (they are normalised), got "
                    f"{self.method.weights}"
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
                "method.weights is only used by the fixed method; remove it or set method.name: "
                "fixed"
            )

    def _check_method_fits(self) -> None:
        if self.method.name == "gradient-alignment":
            accuracy = [d.name for d in self.datasets if d.metric == "accuracy"]
            if accuracy:
                raise ValueError(
                    f"method.name gradient-alignment cannot keep accuracy constraints {accuracy}: "
                    "its slopes are gradient dot products of a differentiable stand-in, not "
                    "changes in accuracy, so they cannot be compared with the accuracy slack; use "
                    "method.name: dynamics (or fixed), or remove those constraints"
                )
            if self.method.alignment_batches > self.evaluation.batches:
                raise ValueError(
                    f"method.alignment_batches ({self.method.alignment_batches}) must not exceed "
                    f"evaluation.batches ({self.evaluation.batches}): the domain gradients average "
                    "the first "
                    "eval batches; lower method.alignment_batches or raise evaluation.batches"
                )
        if self.method.name == "fixed" and self.method.backtrack:
            raise ValueError(
                "method.backtrack re-decides the mixture, which fixed weights never do; remove it "
                "or set method.name: dynamics"
            )

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


def _method_margin(method: Any) -> float:
    """The selection margin of ``method`` (a ``method:`` section or a MethodConfig): its
    variant's, the default variant's under DynaMiCS without one, 0 for other methods."""
    if isinstance(method, MethodConfig):
        name, variant = method.name, method.variant
    elif isinstance(method, dict):
        name, variant = method.get("name", "dynamics"), method.get("variant")
    else:
        return 0.0  # the method section's own validation says what is wrong with it
    if variant is None and name == "dynamics":
        variant = DEFAULT_VARIANT
    return SELECTION_MARGINS.get(variant or "paper", 0.0)


def _source_key(dataset: DatasetConfig) -> tuple[str | None, ...]:
    """What identifies a dataset's rows: the file (as an absolute path) or hub id, its
    configuration and the split (two slices of one split are different data)."""
    path = (
        None
        if dataset.path is None
        else os.path.normpath(os.path.abspath(os.path.expanduser(dataset.path)))
    )
    return (path, dataset.hub_id, dataset.config_name, dataset.split.replace(" ", ""))
