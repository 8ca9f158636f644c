"""The run config's ``method`` section: which mixture policy runs, its update schedule,
the solver's grid, and the options beyond the paper (docs/config.md lists every field)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dynamics.core.options import DEFAULT_VARIANT, VARIANTS, RobustOptions
from dynamics.engine.config_section import ConfigSection


class GridConfig(ConfigSection):
    lambdas: list[float] | None = Field(None, description="Penalty strengths, each > 0 (default: 15 log-spaced in [1, 5000]).")
    epsilons: list[float] | None = Field(None, description="Safety margins, each >= 0 (default: 0, 0.05, 0.1).")

    @field_validator("lambdas", "epsilons")
    @classmethod
    def _grid_values(cls, values: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if values is None:
            return None
        if not values:
            raise ValueError("an empty list; give at least one value, or remove the field for the default grid")
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
    predictor: Literal["linear", "curve"] = Field("linear", description="Loss predictor (curve: appendix J).")
    grid: GridConfig = Field(default_factory=GridConfig, description="The (lambda, eps) solver grid.")
    weights: dict[str, float] | None = Field(
        None, description="Fixed method only: weight per fine-tuning dataset name (>= 0, normalised)."
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
        None, description="Add the directly solved constrained optimum to the (lambda, eps) grid's candidates."
    )
    noise_margin: float | None = Field(
        None, ge=0, description="Constraint margin in standard errors of each predicted change (0: none)."
    )
    target_noise: float | None = Field(
        None, ge=0, description="Score the target objective this many standard errors pessimistically (0: none)."
    )
    calibration: bool | None = Field(
        None, description="Correct predictions by the per-step error realized at past updates."
    )
    dataset_calibration: bool | None = Field(
        None,
        description="Attribute the error realized at past updates to the datasets trained on, and raise each "
        "constraint slope by its share (only tightens; replaces calibration, so set calibration: false).",
    )
    gain_exponent: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Diminishing returns: an improvement extrapolated past the probe's length grows as a "
        "power with this exponent instead of linearly (1: linear, as the paper).",
    )
    metric_floors: bool | None = Field(
        None,
        description="No dataset's predicted improvement takes a domain below the lowest value its metric can "
        "have (a loss of 0, an accuracy of 100%).",
    )
    full_step_z: float | None = Field(
        None,
        ge=0,
        description="Move from the mixture in force toward the solver's answer in proportion to its predicted "
        "target gain in standard errors, all the way at this many (0: always all the way, as the paper).",
    )
    target_share: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Keep at least this share of the mixture on target datasets while every predicted "
        "constraint still holds (0: none, as the paper).",
    )
    share_in_fallback: bool | None = Field(
        None,
        description="Keep target_share's share also when no mixture is predicted to keep every constraint, "
        "as far as no constraint's predicted violation grows by more than one standard error of its "
        "predicted change (needs target_share > 0).",
    )
    target_floor: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="The least weight of every target dataset (one named like a target domain) at every "
        "update, given way where no mixture with it but one without it is predicted to keep every "
        "constraint (0: none, as the paper; 0.02 with variant: robust, 0 there when general_fallback is set).",
    )
    general_floor: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="The least weight of every non-target dataset at every update while some constraint is "
        "kept (none without one), held or given way together with target_floor (0: none, as the paper).",
    )
    floor_deadline: float | None = Field(
        None,
        gt=0,
        le=1,
        description="From this fraction of training on, an update drops target_floor and general_floor while "
        "no main evaluation has yet been feasible, so that the rest of the run goes to the constraints (1: never).",
    )
    general_fallback: float | None = Field(
        None,
        ge=0,
        description="Where no mixture is predicted to keep every constraint, train the non-target datasets' "
        "least-violating mixture unless a mixture with target data is predicted to violate less by more than "
        "this many standard errors (0: off, as the paper; needs min_weight at 0, and turns variant: robust's "
        "target_floor off).",
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
    warmup_room: bool | None = Field(
        None,
        description="At the updates whose probes are shorter than the schedule's longest (the dense warmup's "
        "first), hold each target dataset at its target_floor and train the non-target datasets' mixture "
        "predicted to leave the constraints the most room, instead of the solver's answer (false: as the "
        "paper and variant: robust).",
    )
    warmup_fallback: bool | None = Field(
        None,
        description="warmup_room at only those of the warmup's updates where no mixture is predicted to keep "
        "every constraint (false: as the paper and variant: robust; not with warmup_room).",
    )
    min_weight: float = Field(
        0.0,
        ge=0,
        description="The least weight of every training dataset at every update (N * min_weight <= 1); the "
        "solver finds the best mixture among those. A share of batches, also under training.sampling: tokens "
        "(as are target_floor, general_floor and target_share). With the fixed method, each normalised "
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
        if self.robust_options().general_fallback > 0 and self.min_weight > 0:
            raise ValueError(
                "general_fallback trains no target data where no mixture is predicted feasible, which "
                "min_weight forbids: set one of them to 0"
            )
        if self.backtrack_patience > 1 and self.backtrack == 0:
            raise ValueError(
                "method.backtrack_patience says when a run backtracks, and method.backtrack is 0 (never): "
                "set method.backtrack > 0, or remove backtrack_patience"
            )
        return self

    def robust_options(self) -> RobustOptions:
        """The variant's options with the fields set here overriding it (the paper's method
        under a method without a variant). A field set here also turns off the variant's
        options that need what it turns off: ``expected_accuracy: false`` its answer tolerance,
        ``general_fallback`` its target floor (set both to have the contradiction refused)."""
        preset = VARIANTS[self.variant or "paper"]
        chosen = {
            name: getattr(self, name) if getattr(self, name) is not None else getattr(preset, name)
            for name in RobustOptions.__dataclass_fields__
        }
        if self.expected_accuracy is False and self.answer_tolerance is None:
            chosen["answer_tolerance"] = 0.0
        if self.general_fallback and self.target_floor is None:
            chosen["target_floor"] = 0.0
        return RobustOptions(**chosen)
