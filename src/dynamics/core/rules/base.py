"""What a decision rule is: its parameters, what it requires, the hooks through which it acts
on a mixture update, and the record it leaves (:mod:`dynamics.core.rules.update` runs them).

An update with rules goes through these stages, each rule acting in the ones it overrides:

1. ``measure``: how the probes' changes are read (the expected accuracy).
2. ``tolerate``: how predictions are judged against the references, after differences below
   an evaluation's resolution are read as none (the answer tolerance).
3. ``shape``: the robust problem the candidates are scored on (pessimism, diminishing
   returns, floors).
4. ``candidates``: mixtures added to the (lambda, eps) grid's (the direct optimum).

Every stage runs the rules in the registry's order (:data:`RULES`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from dynamics.core.problem import MixtureProblem
from dynamics.core.robust import Candidate, RobustProblem

if TYPE_CHECKING:  # the policy interface imports the records, which import the rules' records
    from dynamics.core.policy_interface import UpdateContext

__all__ = [
    "RULES",
    "Candidate",
    "Measurement",
    "Params",
    "Rule",
    "UpdateStep",
    "described",
    "register",
]


@dataclass(frozen=True)
class Params:
    """A rule's parameters; every default is the rule off. A subclass checks its values in
    ``__post_init__`` and refuses a bad one in one line naming ``method.<field>``."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Params:
        return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in row})

    @property
    def is_off(self) -> bool:
        return self == type(self)()


def described(default: Any, description: str, **bounds: float) -> Any:
    """A parameter field with its config documentation and bounds (``ge``, ``gt``, ``le``,
    ``lt``), read by the config section generated from the rules."""
    return field(default=default, metadata={"description": description, "bounds": bounds})


@dataclass(frozen=True)
class Measurement:
    """How an update reads its probes' changes."""

    expected_accuracy: bool = False


@dataclass
class UpdateStep:
    """What the rules of one update share: the update's context, the columns of the probed
    datasets that are target data, the questions of each domain's probe-sized evaluation
    (0 for a loss), what the accuracy slopes were read from, and the policy's details that
    go to the record's ``extra``."""

    context: UpdateContext
    target_datasets: list[int]
    questions: list[int]
    accuracy_slopes: str | None
    extra: dict[str, Any] = field(default_factory=dict)


P = TypeVar("P", bound=Params)


class Rule(Generic[P]):
    """A decision rule: ``params`` and the hooks it overrides; every hook leaves the update
    as it is by default. ``requires`` names the rules it acts through: with one of them off
    the combination is refused (:func:`dynamics.core.rules.registry.check_requirements`)."""

    name: ClassVar[str]
    params_type: ClassVar[type[Params]]
    record_type: ClassVar[type[Params] | None] = None  # None: the record is ``params_type``
    requires: ClassVar[tuple[str, ...]] = ()
    config_paths: ClassVar[dict[str, str]] = {}  # a parameter set elsewhere than method.<name>

    @classmethod
    def config_path(cls, parameter: str) -> str:
        """Where a user sets ``parameter`` in the run config."""
        return cls.config_paths.get(parameter, f"method.{parameter}")

    @classmethod
    def read_record(cls, row: dict[str, Any]) -> Params:
        """The rule's record read back from an update's ``extra["robust"]``."""
        return (cls.record_type or cls.params_type).from_dict(row)

    def __init__(self, params: P) -> None:
        self.params = params

    def measure(self, measurement: Measurement) -> Measurement:
        return measurement

    def tolerate(self, problem: MixtureProblem, step: UpdateStep) -> MixtureProblem:
        return problem

    def shape(self, robust: RobustProblem, step: UpdateStep) -> RobustProblem:
        return robust

    def candidates(self, robust: RobustProblem, step: UpdateStep) -> list[Candidate]:
        return []

    def record(self) -> Params:
        """This update's record of the rule: its parameters, and what it decided where it
        decides something (a subclass of its ``Params`` with those fields)."""
        return self.params


RULES: dict[str, type[Rule[Any]]] = {}
"""Rule name -> rule class, in the order the rules act: the order in which
:mod:`dynamics.core.rules.registry` imports their modules."""


def register(rule: type[Rule[Any]]) -> None:
    """Add ``rule`` to :data:`RULES`, after the rules already there; a rule's module ends by
    registering its rule."""
    if rule.name in RULES:
        raise ValueError(f"a decision rule named {rule.name!r} is already registered")
    RULES[rule.name] = rule
