"""The ``method.<rule parameter>`` fields' descriptions, generated from the rules and the
shipped variants."""

from __future__ import annotations

from dataclasses import dataclass, fields

from dynamics.core.rules.base import Params, Rule, described
from dynamics.engine.method_config import MethodConfig, _rule_field


@dataclass(frozen=True)
class _UnusedParams(Params):
    unused_share: float = described(0.0, "A share no variant sets (0: off).", ge=0, lt=1)


class _Unused(Rule[_UnusedParams]):
    name = "unused"
    params_type = _UnusedParams


def test_a_parameter_a_variant_sets_names_every_variants_value() -> None:
    description = MethodConfig.model_fields["gain_exponent"].description
    assert description is not None
    assert description.endswith("Unset: the variant's (robust: 0.5; 1.0 in the others).")


def test_a_parameter_no_variant_sets_names_its_default_only() -> None:
    (parameter,) = fields(_UnusedParams)
    description = _rule_field(_Unused, parameter).description
    assert description == "A share no variant sets (0: off). Unset: 0.0 (no variant sets it)."
