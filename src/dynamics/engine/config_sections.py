"""The sections of the run config that stand alone (the model, LoRA, the optimizer, the
training run, the evaluations), their common base, and the error a config that cannot be
used raises. docs/config.md lists every field; ``dynamics.engine.config.RunConfig`` holds
them, with the method and the datasets, and checks them against each other."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the field and the fix."""


class ConfigSection(BaseModel):
    """A section of the run config: unknown fields refused, frozen once validated."""

    # NaN and infinity are never meaningful settings (a NaN weight or learning rate would
    # only surface as NaN losses minutes into the run), so every float field refuses them.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
        description="Weights dtype; 'auto' is float32 on CPU and bfloat16 on GPUs that support "
        "it. float64 makes a run's numbers the same on CPUs with different vector instructions, "
        "at about twice float32's time and memory.",
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
        description="Attention kernel (transformers' attn_implementation); null is transformers' "
        "default (sdpa where the model supports it). flash_attention_2/3 need a CUDA GPU and the "
        "flash-attn package.",
    )
    quantization: QuantizationConfig | None = Field(
        None,
        description="Load the base weights quantized through bitsandbytes and train a LoRA "
        "adapter on them (QLoRA): {bits: 4} is NF4 with double quantization and bfloat16 compute, "
        "{bits: 8} is LLM.int8(). Needs lora, model.name_or_path, a CUDA GPU and the bitsandbytes "
        "package (pip install 'dynamics[qlora]'); null loads the weights in model.dtype.",
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
                "model.quantization quantizes weights loaded from model.name_or_path; a model "
                "built from model.init_config has none to load: remove model.quantization"
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
                f"each AdamW beta must lie in [0, 1), got {list(betas)}; the default is [0.9, "
                "0.999]"
            )
        return betas


class TrainingConfig(ConfigSection):
    total_steps: int = Field(2048, ge=1, description="Optimizer steps of the main run.")
    batch_size: int = Field(8, ge=1, description="Sequences per micro-batch (per process).")
    gradient_accumulation: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    sequence_length: int = Field(512, ge=8, description="Tokens per sequence (truncate or pack).")
    packing: bool | Literal["per-document"] = Field(
        False,
        description="Pack documents into full sequences instead of truncating them: true lets "
        "packed documents attend to each other; 'per-document' restarts positions at each "
        "document and keeps attention within it (no attention mask; every attn_implementation).",
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
        description="Seed of the eval/test splits and of the fixed evaluation batches, kept apart "
        "from seed so that runs with different seeds are scored on the same rows.",
    )
    max_skipped_steps: int = Field(
        8,
        ge=0,
        description="Main-run steps with a non-finite loss or gradient that are skipped (never "
        "applied) before the run stops as diverged.",
    )
    split_probes: bool = Field(
        True,
        description="Under several processes, each process probes its own share of the "
        "fine-tuning datasets (when the process count divides their number) instead of every "
        "process taking part in every probe.",
    )
    checkpoint_interval: int | None = Field(
        None,
        ge=0,
        description="Save the full training state to last_checkpoint/ every this many steps, for "
        "--resume (null: at every main evaluation; 0: never).",
    )
    sampling: Literal["batches", "tokens"] = Field(
        "batches",
        description="What the mixture weights are shares of: batches (each batch is drawn from "
        "dataset j with probability w_j) or tokens (dataset j is drawn with probability "
        "proportional to w_j over its mean non-padding tokens per batch, so that over the run it "
        "gets a share w_j of the trained tokens). The solver predicts and chooses batch shares "
        "either way; under tokens, method.weights and the records' weights are token shares, and "
        "each update also records the batch shares it trains (extra.batch_shares).",
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
        description="Batches per domain in a probe's evaluation, the first of the main ones "
        "(paper: 50).",
    )
    batch_size: int | None = Field(
        None, ge=1, description="Evaluation batch size (default: training.batch_size)."
    )
    relative_noise: float = Field(
        0.0,
        ge=0,
        description="A sensitivity check, not for training: multiply every evaluated value "
        "(probes' too) by "
        "1 + this x N(0, 1), e.g. 1e-6, the size of what separates two machines (0: off).",
    )
    noise_seed: int = Field(0, ge=0, description="Seed of relative_noise's draws.")
    # RunConfig sets an unset margin to its method's before this section is validated, so a
    # run config's always holds a float; None is only the field's default.
    selection_margin: float = Field(
        None,  # type: ignore[assignment]
        ge=0,
        description="Checkpoint selection as a chance constraint: the best of the feasible "
        "checkpoints whose every constraint clears its reference on the eval split by this many "
        "standard errors of its change, measured batch by batch; where none does, the feasible "
        "checkpoint whose closest constraint is the most errors inside its reference (0: the best "
        "feasible checkpoint, the paper's choice). More evaluation.batches narrow the errors. "
        "Unset: the method's (1.8 for method.variant: robust, 0 otherwise), written out in the "
        "saved config.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> EvaluationConfig:
        if self.reduced_batches > self.batches:
            raise ValueError(
                f"evaluation.reduced_batches ({self.reduced_batches}) must not exceed "
                "evaluation.batches "
                f"({self.batches}): the reduced evaluation is a subset of the main one"
            )
        if self.selection_margin and self.batches < 2:
            raise ValueError(
                f"evaluation.selection_margin {self.selection_margin:g} (method.variant: robust's "
                "when unset) chooses the checkpoint by the standard errors of its changes over "
                "the eval batches, and evaluation.batches is 1, which has none: set "
                "evaluation.batches to 2 or more, or evaluation.selection_margin: 0"
            )
        return self


def _all_finite(value: Any) -> bool:
    """No NaN or infinity anywhere in a nested value (the saved YAML could not keep them)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_all_finite(v) for v in value)
    return True
