"""Decision rules beyond the paper: each rule one module (its parameters, their checks, the
stages of an update it acts in, its record), registered by one line in
:mod:`dynamics.core.rules.registry`; a variant is a named list of rules with parameters.

docs/beyond-the-paper.md describes every rule and its value in ``variant: robust``."""

from dynamics.core.rules.base import Candidate, Measurement, Params, Rule, UpdateStep
from dynamics.core.rules.record import ChoiceRecord, RulesRecord
from dynamics.core.rules.registry import (
    DEFAULT_VARIANT,
    RULES,
    VARIANTS,
    RuleSet,
    register,
    rule_of,
    rule_set,
    setting,
)

__all__ = [
    "DEFAULT_VARIANT",
    "RULES",
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
