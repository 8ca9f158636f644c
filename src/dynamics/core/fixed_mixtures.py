"""The paper's fixed-weight baselines (section 4.4): :func:`fixed_mixture_sweep` generates
the uniform and proportional schemes over target masses, each a mixture a
:class:`~dynamics.core.policies.FixedWeightsPolicy` trains for the whole run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAPER_TARGET_MASSES = (0.0, 0.2, 0.5, 0.8, 1.0)


@dataclass(frozen=True)
class FixedMixture:
    """One configuration of the fixed-weight sweep."""

    label: str  # e.g. "uniform-w0.2"
    scheme: str  # "uniform" | "proportional"
    target_mass: float
    weights: tuple[float, ...]


def fixed_mixture_sweep(
    roles: Sequence[str],
    budgets: Sequence[int | None],
    target_masses: Sequence[float] = PAPER_TARGET_MASSES,
    schemes: Sequence[str] = ("uniform", "proportional"),
) -> list[FixedMixture]:
    """The paper's fixed-weight baselines (section 4.4).

    roles[j] is "target" or "non-target" for fine-tuning dataset j; budgets[j] its sample
    count (None = unlimited). Uniform: mass w split equally over targets, 1 - w equally
    over non-targets. Proportional: w split over targets by sample count, 1 - w still
    uniform; left out when a target has no finite positive budget. Only the ``schemes``
    asked for are generated, and among them a configuration identical to one already
    listed is skipped (e.g. w = 0, a single target, equal budgets), so asking for
    proportional alone still gives its runs. With no non-target dataset, only w = 1 is
    meaningful.
    """
    if len(roles) != len(budgets):
        raise ValueError("roles and budgets must have one entry per fine-tuning dataset")
    unknown = sorted({r for r in roles if r not in ("target", "non-target")})
    if unknown:
        raise ValueError(f"unknown dataset roles {unknown}: use 'target' or 'non-target'")
    targets = [j for j, r in enumerate(roles) if r == "target"]
    others = [j for j, r in enumerate(roles) if r == "non-target"]
    if not targets:
        raise ValueError("the fixed-weight sweep needs at least one target dataset")
    for w in target_masses:
        if not 0.0 <= w <= 1.0:
            raise ValueError(f"target mass {w} is outside [0, 1]")
    unknown = sorted({s for s in schemes if s not in ("uniform", "proportional")})
    if unknown:
        raise ValueError(f"unknown fixed-weight schemes {unknown}: use 'uniform' or 'proportional'")
    target_budgets = [budgets[j] for j in targets]

    out: list[FixedMixture] = []
    for scheme in [s for s in ("uniform", "proportional") if s in schemes]:
        if scheme == "proportional" and any(b is None or b <= 0 for b in target_budgets):
            continue  # proportional split is undefined without finite positive budgets
        for w in target_masses:
            if not others and w < 1.0:
                continue
            weights = np.zeros(len(roles))
            if scheme == "uniform":
                weights[targets] = w / len(targets)
            else:
                counts = np.asarray(target_budgets, dtype=float)
                weights[targets] = w * counts / counts.sum()
            if others:
                weights[others] = (1.0 - w) / len(others)
            if any(np.allclose(weights, m.weights, atol=1e-12) for m in out):
                continue
            out.append(
                FixedMixture(f"{scheme}-w{w:g}", scheme, float(w), tuple(float(x) for x in weights))
            )
    return out
