"""Decision rules beyond the paper: each rule one module (its parameters, their checks, the
stages of an update it acts in, its record, and the line that registers it), imported by one
line of :mod:`dynamics.core.rules.registry`; a variant is a named list of rules with
parameters.

docs/beyond-the-paper.md describes every rule and its value in ``variant: robust``."""

from dynamics.core.rules.base import (
    RULES,
    Candidate,
    Measurement,
    Params,
    Rule,
    UpdateStep,
    register,
)
from dynamics.core.rules.record import ChoiceRecord, RulesRecord
from dynamics.core.rules.registry import (
    DEFAULT_VARIANT,
    SELECTION_MARGINS,
    VARIANTS,
    RuleSet,
    rule_of,
    rule_set,
    setting,
)

__all__ = [
    "DEFAULT_VARIANT",
    "RULES",
    "SELECTION_MARGINS",
    "VARIANTS",
    "Candidate",
    "ChoiceRecord",
    "Measurement",
    "Params",
    "Rule",
    "RuleSet",
    "RulesRecord",
    "UpdateStep",
    "register",
    "rule_of",
    "rule_set",
    "setting",
]
