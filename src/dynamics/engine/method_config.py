"""The run config's ``method`` section: which mixture policy runs, its update schedule,
the solver's grid, the floors, and the decision rules beyond the paper (docs/config.md lists
every field). Each rule's fields are generated from its parameters
(:mod:`dynamics.core.rules`), so a rule is described in its own module only."""

from __future__ import annotations

from dataclasses import Field as DataclassField
from dataclasses import fields, replace
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dynamics.core.policy_registry import POLICIES
from dynamics.core.rules import DEFAULT_VARIANT, RULES, VARIANTS, Rule, RuleSet
from dynamics.core.rules.target_floor import TargetFloor, TargetFloorParams
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


def _rule_field(rule: type[Rule[Any]], parameter: DataclassField[Any]) -> Any:
    """The config field that overrides ``parameter`` of ``rule``: unset (None) keeps the
    variant's value. Its description is the rule's, with every variant's value."""
    in_variants = [
        f"{name}: {_yaml(getattr(p, parameter.name))}"
        for name, variant in VARIANTS.items()
        for p in variant
        if type(p) is rule.params_type
    ]
    off = _yaml(parameter.default)
    needs = [
        RULES[name].config_path(f.name)
        for name in rule.requires
        for f in fields(RULES[name].params_type)
    ]
    unset = (
        f"the variant's ({'; '.join(in_variants)}; {off} in the others)"
        if in_variants
        else f"{off} (no variant sets it)"
    )
    description = (
        f"{parameter.metadata['description']}"
        f"{' Needs ' + ', '.join(needs) + ' on.' if needs else ''} Unset: {unset}."
    )
    return Field(None, description=description, **parameter.metadata.get("bounds", {}))


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _rule_fields() -> tuple[dict[str, Any], dict[str, Any]]:
    """The annotations and fields of every rule parameter set as ``method.<name>``."""
    annotations: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    for rule in RULES.values():
        for parameter in fields(rule.params_type):
            path = rule.config_path(parameter.name)
            if path == f"method.{parameter.name}":
                annotations[parameter.name] = type(parameter.default) | None
                defaults[parameter.name] = _rule_field(rule, parameter)
    return annotations, defaults


_RULE_ANNOTATIONS, _RULE_FIELDS = _rule_fields()

_MOVED = {
    "min_weight": "floors: {all: VALUE}",
    "target_floor": "floors: {targets: VALUE}",
}
"""Keys of the method section written elsewhere, and where."""


class FloorsConfig(ConfigSection):
    all: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="The least weight of every training dataset at every update (N * all <= 1); "
        "the solver finds the best mixture among those. A share of batches, also under "
        "training.sampling: tokens (as is targets). With the fixed method, each normalised "
        "weight's batch share must be at least this.",
    )
    targets: float | None = _rule_field(
        TargetFloor, next(f for f in fields(TargetFloorParams) if f.name == "target_floor")
    )


class MethodConfig(ConfigSection):
    name: str = Field(
        "dynamics",
        description="Mixture policy: dynamics (DynaMiCS), fixed (fixed weights), or "
        "gradient-alignment (loss constraints only).",
    )
    schedule: str | list[int] = Field(
        "dense-warmup",
        description="Update schedule: no-warmup, light-warmup, dense-warmup, fixed:H, or a list "
        "of steps.",
    )
    probe_cap: int | None = Field(
        None, ge=1, description="c_max; default 128 scaled by total_steps / 2048."
    )
    probe_min: int = Field(
        1,
        ge=1,
        description="The fewest steps a probe trains (at most c_max; 1: each probe as long as "
        "its update's horizon, up to c_max, as the paper does). Longer probes measure a dense "
        "warmup's first updates over more steps than they decide.",
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
        description="Gradient alignment: batches per gradient average (at most "
        "evaluation.batches: the domain gradients average the first eval batches).",
    )
    variant: str | None = Field(
        None,
        description="DynaMiCS with the decision rules chosen in docs/beyond-the-paper.md (robust, "
        "what method.name: dynamics gets when this is not set), or as the paper states it "
        "(paper, the reference); the rules' fields below and floors.targets override single "
        "parameters.",
    )
    # One field per rule parameter, generated from the rules' parameter classes.
    __annotations__.update(_RULE_ANNOTATIONS)
    locals().update(_RULE_FIELDS)
    floors: FloorsConfig = Field(
        default_factory=FloorsConfig,
        description="Least weights: all (every training dataset) and targets (every target "
        "dataset; the target_floor rule).",
    )
    backtrack: int = Field(
        0,
        ge=0,
        description="Times a run may return to its last feasible main evaluation when one shows "
        "a broken constraint, and decide again with that violation as a margin (0: never, as in "
        "the paper).",
    )
    backtrack_patience: int = Field(
        1,
        ge=1,
        description="Main evaluations in a row that must show a broken constraint before the run "
        "backtracks (1: the first one); a violation repaired by the next evaluation then costs no "
        "steps trained again. Needs backtrack > 0.",
    )

    @field_validator("name")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        if name not in POLICIES:
            raise ValueError(f"unknown method.name {name!r}: use one of {sorted(POLICIES)}")
        return name

    @field_validator("variant")
    @classmethod
    def _known_variant(cls, variant: str | None) -> str | None:
        if variant is not None and variant not in VARIANTS:
            raise ValueError(f"unknown method.variant {variant!r}: use one of {sorted(VARIANTS)}")
        return variant

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """Floors are one setting: the keys that set them one by one are refused."""
        if isinstance(data, dict):
            for key, written in _MOVED.items():
                if key in data:
                    raise ValueError(
                        f"method.{key} is set in method.floors: write "
                        f"{written.replace('VALUE', str(data[key]))}"
                    )
        return data

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
    def _rules_fit_together(self) -> MethodConfig:
        """Rules whose requirement is off (one line naming both settings), or that a method
        without probes cannot use, are refused with the config."""
        if not self.rules().is_paper and self.name != "dynamics":
            raise ValueError(
                "method.variant and the decision rules need probes, so only method.name: "
                "dynamics uses them; remove them or set method.name: dynamics"
            )
        if self.backtrack_patience > 1 and self.backtrack == 0:
            raise ValueError(
                "method.backtrack_patience says when a run backtracks, and method.backtrack is 0 "
                "(never): set method.backtrack > 0, or remove backtrack_patience"
            )
        return self

    def rules(self) -> RuleSet:
        """The variant's rules with the parameters set here replacing its values (the paper's
        method under a method without a variant). Nothing set is changed: a rule whose
        required rule ends up off is refused (:class:`dynamics.core.rules.RuleSet`)."""
        variant = self.variant or "paper"
        preset = {type(p): p for p in VARIANTS[variant]}
        overrides = []
        for rule in RULES.values():
            chosen = {
                f.name: value
                for f in fields(rule.params_type)
                if (value := self._setting(rule.config_path(f.name))) is not None
            }
            if chosen:
                base = preset.get(rule.params_type, rule.params_type())
                overrides.append(replace(base, **chosen))
        return RuleSet.of_variant(variant, tuple(overrides))

    def _setting(self, path: str) -> Any:
        """The value written at ``path`` (``method.x`` or ``method.floors.x``), None if unset."""
        section: Any = self
        for part in path.split(".")[1:]:
            section = getattr(section, part)
        return section

    @property
    def target_floor(self) -> float:
        """The least weight of each target dataset the rules hold (0: none)."""
        return self.rules().get(TargetFloorParams).target_floor
