"""The run config's ``method`` section: which mixture policy runs, its update schedule,
the solver's grid, and the options beyond the paper (docs/config.md lists every field)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dynamics.core.options import DEFAULT_VARIANT, VARIANTS, RobustOptions
from dynamics.engine.config_sections import ConfigSection


class GridConfig(ConfigSection):
    lambdas: list[float] | None = Field(
        None, description="Penalty strengths, each > 0 (default: 15 log-spaced in [1, 5000])."
    )
    epsilons: list[float] | None = Field(
        None, description="Safety margins, each >= 0 (default: 0, 0.05, 0.1)."
    )

    @field_validator("lambdas", "epsilons")
    @classmethod
    def _grid_values(cls, values: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if values is None:
            return None
        if not values:
            raise ValueError(
                "an empty list; give at least one value, or remove the field for the default grid"
            )
        if info.field_name == "lambdas" and any(v <= 0 for v in values):
            raise ValueError(f"every penalty strength must be > 0, got {values}")
        if info.field_name == "epsilons" and any(v < 0 for v in values):
            raise ValueError(f"every safety margin must be >= 0, got {values}")
        return values


class MethodConfig(ConfigSection):
    name: Literal["dynamics", "fixed", "gradient-alignment"] = Field(
        "dynamics",
        description="Mixture policy: DynaMiCS, fixed weights, or gradient alignment (loss constraints only).",
    )
    schedule: str | list[int] = Field(
        "dense-warmup",
        description="Update schedule: no-warmup, light-warmup, dense-warmup, fixed:H, or a list of steps.",
    )
    probe_cap: int | None = Field(
        None, ge=1, description="c_max; default 128 scaled by total_steps / 2048."
    )
    probe_min: int = Field(
        1,
        ge=1,
        description="The fewest steps a probe trains (at most c_max; 1: each probe as long as its update's "
        "horizon, up to c_max, as the paper does). Longer probes measure a dense warmup's first updates over "
        "more steps than they decide.",
    )
    predictor: Literal["linear", "curve"] = Field(
        "linear", description="Loss predictor (curve: appendix J)."
    )
    grid: GridConfig = Field(
        default_factory=GridConfig, description="The (lambda, eps) solver grid."
    )
    weights: dict[str, float] | None = Field(
        None,
        description="Fixed method only: weight per fine-tuning dataset name (>= 0, normalised).",
    )
    alignment_batches: int = Field(
        200,
        ge=1,
        description="Gradient alignment: batches per gradient average (at most evaluation.batches: the "
        "domain gradients average the first eval batches).",
    )
    variant: Literal["paper", "robust"] | None = Field(
        None,
        description="DynaMiCS with the robustness options chosen in docs/beyond-the-paper.md (robust, what "
        "method.name: dynamics gets when this is not set), or as the paper states it (paper, the reference); "
        "the fields below override single options.",
    )
    lp_candidate: bool | None = Field(
        None,
        description="Add the directly solved constrained optimum to the (lambda, eps) grid's candidates "
        "(unset: the variant's, on wherever target_noise or gain_exponent is set, which act through it; "
        "false with either is refused).",
    )
    target_noise: float | None = Field(
        None,
        ge=0,
        description="Score the target objective this many standard errors pessimistically (0: none).",
    )
    calibration: bool | None = Field(
        None, description="Correct predictions by the per-step error realized at past updates."
    )
    gain_exponent: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Diminishing returns: an improvement extrapolated past the probe's length grows as a "
        "power with this exponent instead of linearly (1: linear, as the paper).",
    )
    target_floor: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="The least weight of every target dataset (one named like a target domain) at every "
        "update, given way where no mixture with it but one without it is predicted to keep every "
        "constraint (0: none, as the paper; 0.02 with variant: robust).",
    )
    expected_accuracy: bool | None = Field(
        None,
        description="Read each accuracy constraint's slopes from the change of its expected accuracy (the "
        "mean probability of the correct choice), which short probes move before any answer flips, instead "
        "of from the answers that flipped. On with variant: robust, whose answer_tolerance: 0.5 keeps a drift "
        "of a real model's answer probabilities that flips no answer from reading as a broken constraint; "
        "false turns that tolerance off too.",
    )
    answer_tolerance: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="With expected_accuracy: a mixture predicted to lose less than this fraction of one answer "
        "of an accuracy constraint (on the probes' evaluation) counts as keeping it, so that a drift of the "
        "correct choices' probability too small to flip an answer does not break every mixture (0: off, as "
        "the paper; 0.5, variant: robust's: a predicted loss that rounds to no answer).",
    )
    min_weight: float = Field(
        0.0,
        ge=0,
        description="The least weight of every training dataset at every update (N * min_weight <= 1); the "
        "solver finds the best mixture among those. A share of batches, also under training.sampling: tokens "
        "(as is target_floor). With the fixed method, each normalised "
        "weight's batch share must be at least this.",
    )
    backtrack: int = Field(
        0,
        ge=0,
        description="Times a run may return to its last feasible main evaluation when one shows a broken "
        "constraint, and decide again with that violation as a margin (0: never, as in the paper).",
    )
    backtrack_patience: int = Field(
        1,
        ge=1,
        description="Main evaluations in a row that must show a broken constraint before the run backtracks "
        "(1: the first one); a violation repaired by the next evaluation then costs no steps trained again. "
        "Needs backtrack > 0.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_variant(cls, data: Any) -> Any:
        """DynaMiCS without a variant gets the default one, written out so that the saved
        config says which ran; the other methods have no probes and no variant (``paper``,
        which asks for no option, is read as none: configs saved with it resume)."""
        if not isinstance(data, dict):
            return data
        if data.get("name", "dynamics") == "dynamics":
            return data if data.get("variant") is not None else {**data, "variant": DEFAULT_VARIANT}
        return {**data, "variant": None} if data.get("variant") == "paper" else data

    @model_validator(mode="after")
    def _options_fit_together(self) -> MethodConfig:
        """Options that contradict each other (RobustOptions says which and how to fix it), or
        that a method without probes cannot use, are refused with the config."""
        if not self.robust_options().is_paper and self.name != "dynamics":
            raise ValueError(
                "method.variant and the robustness options need probes, so only method.name: dynamics "
                "uses them; remove them or set method.name: dynamics"
            )
        if self.backtrack_patience > 1 and self.backtrack == 0:
            raise ValueError(
                "method.backtrack_patience says when a run backtracks, and method.backtrack is 0 (never): "
                "set method.backtrack > 0, or remove backtrack_patience"
            )
        return self

    def robust_options(self) -> RobustOptions:
        """The variant's options with the fields set here overriding it (the paper's method
        under a method without a variant). ``expected_accuracy: false`` set here also turns
        off the variant's answer tolerance, which needs it (set both to have the contradiction
        refused); likewise ``target_noise`` or ``gain_exponent`` set here turns the direct
        candidate on unless ``lp_candidate`` is set too."""
        preset = VARIANTS[self.variant or "paper"]
        chosen = {
            name: getattr(self, name) if getattr(self, name) is not None else getattr(preset, name)
            for name in RobustOptions.__dataclass_fields__
        }
        if self.expected_accuracy is False and self.answer_tolerance is None:
            chosen["answer_tolerance"] = 0.0
        needs_direct = chosen["target_noise"] > 0 or chosen["gain_exponent"] < 1
        if self.lp_candidate is None and needs_direct:
            chosen["lp_candidate"] = True
        return RobustOptions(**chosen)
