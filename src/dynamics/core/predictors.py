"""Predictors: how probe trajectories become the slope matrix S(t).

Paper eq. 3.2 and the curve-fitting appendix ("DynaMiCS with Non-linear Weight Updates").

A probe on dataset j records the metric of every evaluation domain at normalized probe
progress ``u`` in [0, 1]: u = 0 is the anchor L_i(theta_t), u = 1 is after the whole probe
budget c_t. The *linear* predictor reads only u = 1 (eq. 3.2). The *curve* predictor also
evaluates at u = 1/5, ..., 4/5, fits a parametric curve per (domain i, dataset j) and
reads the predicted change delta_ij at the horizon u_H = H_t / c_t.

Both return slopes in metric units per training step, with ``H_t * S_ij = delta_ij``, so the
solver consumes either through the same prediction (eq. 3.3) and per-dataset effects still
combine additively::

    L_hat_i(w) = L_i(theta_t) + H_t * sum_j S_ij w_j = L_i(theta_t) + sum_j w_j delta_ij

Curve-fitting decisions (the appendix leaves them open):

* **Families.** Power law with offset ``a u^b + d``, exponential ``a exp(-b u) + d`` and
  single power law ``alpha u^p``. Every family is fitted to the change since the anchor,
  ``y(u) - L_i(theta_t)``, at all probe evaluations *and* the anchor itself (value 0 at
  u = 0). For the two families with a free offset ``d`` this is exactly the least-squares
  fit to absolute losses (``d`` absorbs the anchor) on a better-conditioned scale. The
  single power law on absolute losses would predict a loss of 0 at u = 0, so we read it as
  ``L_i(theta_t) + alpha u^p``: the power law whose offset is pinned at the measured anchor.
  It is therefore nested in the power law with offset (both pass through ``d`` at u = 0),
  and AICc keeps the free offset only when many evaluations show that the curve does not
  pass through the anchor; with the paper's six points that is rare.
* **Exponents and rates are bounded** to ``b, p > 0`` (finite at the anchor) and ``b >= 0``
  for the exponential (a decay, not an explosion).
* **AICc** (Hurvich and Tsai, 1989): ``n ln(RSS/n) + 2k + 2k(k+1)/(n-k-1)`` with k the curve
  parameters plus one for the noise variance. When ``n - k - 1 <= 0`` the correction is
  undefined: there are too few points to both fit and penalize the family, so it is not a
  candidate (AICc = +inf). With the paper's 5 evaluations plus the anchor (n = 6) every
  family is a candidate; with 2 points (anchor and end) none is. RSS is floored at the
  resolution of a measured metric (about float32 precision) so that exact fits on
  noiseless data tie, and the tie goes to the family with fewer parameters, instead of
  comparing logarithms of rounding noise.
* **Linear fallback** when no candidate is fitted: a flat trajectory (nothing to fit a
  shape to), too few points, or every fit raising, warning or giving a non-finite
  prediction. The fallback is the anchored line ``L_i(theta_t) + s u`` with ``s`` fitted by
  least squares to all evaluations, which equals eq. 3.2 when only u = 1 was evaluated.
* **Extrapolation guard.** Beyond the probe (u_H > 1) a curve may *temper* the linear
  extrapolation but never *amplify* it: if the selected curve predicts a change larger in
  magnitude than the linear fallback at u_H, the linear prediction is used instead and the
  entry is marked as guarded. A fitted curve that accelerates beyond the observed window
  is extrapolating a trend the data cannot support; the linear predictor is the paper's
  main method, so the curve can only make it more conservative.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

# Names recorded per slope entry (controller.jsonl) for the curve family behind it.
LINEAR = "linear"
POWER_LAW = "power_law"
POWER_LAW_OFFSET = "power_law_offset"
EXPONENTIAL = "exponential"

# Resolution of a measured metric, relative to its magnitude (at least 1): about float32
# precision, in which evaluation losses are accumulated. Residuals below it are not evidence,
# so it floors the RSS in AICc (exact fits on noiseless data tie instead of comparing logs
# of rounding noise) and it is the slack of the extrapolation guard.
_RESOLUTION_REL = 1e-7
# A trajectory whose changes all stay below this (relative to its magnitude) is flat.
_FLAT_REL = 1e-12


@dataclass(frozen=True)
class SlopeEstimate:
    """Slopes from one round of probes, with how each entry was obtained.

    slope_matrix:  S(t), shape (M, N), metric change per training step; H_t * S is the
                   predicted change delta_ij over the horizon.
    models:        shape (M, N), the curve family behind each entry (``LINEAR`` for
                   eq. 3.2, for the fallback and for guarded entries).
    guarded:       shape (M, N), True where the extrapolation guard replaced a fitted curve
                   by the linear prediction.
    """

    slope_matrix: np.ndarray
    models: np.ndarray
    guarded: np.ndarray

    @property
    def details(self) -> dict[str, list]:
        """How each entry was obtained, as plain lists for the update record."""
        return {
            "slope_models": self.models.tolist(),
            "extrapolation_guarded": self.guarded.tolist(),
        }


def linear_slopes(anchor: np.ndarray, probe_end: np.ndarray, probe_budget: int) -> np.ndarray:
    """Eq. 3.2: ``S_ij = (L_i(theta_j) - L_i(theta_t)) / c_t``.

    anchor:       L_i(theta_t), shape (M,).
    probe_end:    L_i(theta_j) after c_t steps on dataset j alone, shape (M, N).
    probe_budget: c_t, the number of probe steps.
    Returns S(t), shape (M, N), in metric units per training step.
    """
    anchor = np.asarray(anchor, dtype=float)
    probe_end = np.asarray(probe_end, dtype=float)
    _check_budget(probe_budget)
    if anchor.ndim != 1 or probe_end.ndim != 2 or probe_end.shape[0] != anchor.shape[0]:
        raise ValueError(
            f"anchor must have shape (M,) and probe_end (M, N); got {anchor.shape} and "
            f"{probe_end.shape}"
        )
    return (probe_end - anchor[:, None]) / probe_budget


def probe_progress(probe_budget: int, num_probe_evals: int) -> tuple[int, ...]:
    """Probe steps (in 1..c_t) after which to evaluate, spread evenly, the last at c_t.

    Their progress values are ``u = steps / c_t``. A short probe has fewer distinct steps
    than requested evaluations (c_t = 2 with 5 evaluations gives (1, 2)); the curve
    predictor then falls back to a linear fit.
    """
    _check_budget(probe_budget)
    if num_probe_evals < 1:
        raise ValueError(f"num_probe_evals must be at least 1, got {num_probe_evals}")
    steps = {
        max(1, round(k * probe_budget / num_probe_evals)) for k in range(1, num_probe_evals + 1)
    }
    return tuple(sorted(steps))


def aicc(rss: float, num_points: int, num_params: int) -> float:
    """Corrected Akaike information criterion of a least-squares fit (Hurvich and Tsai, 1989).

    ``num_params`` counts the curve's parameters; the noise variance adds one more.
    Returns +inf when ``num_points - k - 1 <= 0`` (the correction is undefined: the family
    cannot be compared on so few points) or when ``rss`` is not finite. ``rss`` must be > 0.
    """
    k = num_params + 1
    dof = num_points - k - 1
    if dof <= 0 or not np.isfinite(rss):
        return float("inf")
    return float(num_points * np.log(rss / num_points) + 2 * k + 2 * k * (k + 1) / dof)


# --- curve families, fitted to the change y(u) - L_i(theta_t) -----------------------------


def _power_law(u: np.ndarray, alpha: float, p: float) -> np.ndarray:
    return alpha * u**p


def _power_law_offset(u: np.ndarray, a: float, b: float, d: float) -> np.ndarray:
    return a * u**b + d


def _exponential(u: np.ndarray, a: float, b: float, d: float) -> np.ndarray:
    return a * np.exp(-b * u) + d


@dataclass(frozen=True)
class _Family:
    name: str
    curve: Callable[..., np.ndarray]
    # Initial guess from (u, change): each starts from a shape close to the straight line
    # through the anchor and the probe's end, which every family can bend from.
    initial: Callable[[np.ndarray, np.ndarray], list[float]]
    lower: tuple[float, ...]
    upper: tuple[float, ...]

    @property
    def num_params(self) -> int:
        return len(self.lower)


# Lower bound of power-law exponents: at exactly 0 the curve is the constant a + d (numpy's
# 0**0 is 1), whose parameters are not identifiable.
_TINY_EXPONENT = 1e-6

# Fewer parameters first, so that exact AICc ties go to the simpler family.
_FAMILIES: tuple[_Family, ...] = (
    _Family(
        POWER_LAW,
        _power_law,
        lambda u, dy: [dy[-1], 1.0],
        (-np.inf, _TINY_EXPONENT),
        (np.inf, np.inf),
    ),
    _Family(
        POWER_LAW_OFFSET,
        _power_law_offset,
        lambda u, dy: [dy[-1], 1.0, 0.0],
        (-np.inf, _TINY_EXPONENT, -np.inf),
        (np.inf, np.inf, np.inf),
    ),
    _Family(
        EXPONENTIAL,
        _exponential,
        # a (exp(-u) - 1) through the end point: a = dy_end / (exp(-1) - 1), d = -a.
        lambda u, dy: [dy[-1] / (np.exp(-1.0) - 1.0), 1.0, -dy[-1] / (np.exp(-1.0) - 1.0)],
        (-np.inf, 0.0, -np.inf),
        (np.inf, np.inf, np.inf),
    ),
)


def _fit_family(family: _Family, u: np.ndarray, dy: np.ndarray) -> np.ndarray | None:
    """Least-squares parameters of ``family`` on (u, dy), or None when the fit fails."""
    try:
        # Overflow while exploring large exponents is expected and handled by the optimizer;
        # a covariance that cannot be estimated means the fit is not determined.
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("error", OptimizeWarning)
            params, _ = curve_fit(
                family.curve,
                u,
                dy,
                p0=family.initial(u, dy),
                bounds=(family.lower, family.upper),
            )
    except (RuntimeError, ValueError, OptimizeWarning, np.linalg.LinAlgError):
        return None
    return params if np.all(np.isfinite(params)) else None


def _anchored_line_slope(u: np.ndarray, dy: np.ndarray) -> float:
    """Least-squares slope of ``dy = s u`` (the line through the anchor), per unit of u."""
    return float(u @ dy / (u @ u))


def _predict_change(
    u: np.ndarray, dy: np.ndarray, anchor: float, u_horizon: float
) -> tuple[float, str, bool]:
    """Predicted change at ``u_horizon`` for one (domain, dataset) trajectory.

    ``u`` and ``dy`` include the anchor point (0, 0); ``anchor`` is L_i(theta_t), which sets
    the precision of the measured values. Returns (change, family name, guarded).
    """
    linear_change = _anchored_line_slope(u, dy) * u_horizon
    scale = float(np.abs(dy).max())
    if scale <= _FLAT_REL * max(1.0, abs(anchor)):
        return linear_change, LINEAR, False

    n = u.size
    resolution = _RESOLUTION_REL * max(1.0, abs(anchor))
    rss_floor = n * resolution**2
    best: tuple[float, str, float] | None = None  # (aicc, name, change)
    for family in _FAMILIES:
        if not np.isfinite(aicc(1.0, n, family.num_params)):
            continue
        params = _fit_family(family, u, dy)
        if params is None:
            continue
        with np.errstate(all="ignore"):
            residuals = family.curve(u, *params) - dy
            change = float(family.curve(np.array([u_horizon]), *params)[0])
        if not (np.all(np.isfinite(residuals)) and np.isfinite(change)):
            continue
        score = aicc(max(float(residuals @ residuals), rss_floor), n, family.num_params)
        if best is None or score < best[0]:
            best = (score, family.name, change)

    if best is None:
        return linear_change, LINEAR, False
    _, name, change = best
    if u_horizon > 1.0 and abs(change) > abs(linear_change) + resolution:
        return linear_change, LINEAR, True
    return change, name, False


def curve_slopes(
    u: np.ndarray,
    trajectories: np.ndarray,
    anchor: np.ndarray,
    horizon: int,
    probe_budget: int,
) -> SlopeEstimate:
    """Curve-fitting appendix: effective slopes from curves fitted to each probe trajectory.

    u:             probe progress of the evaluations, shape (K,), increasing in (0, 1]
                   (``probe_progress(...) / probe_budget``; u = 0 is the anchor).
    trajectories:  metric of domain i after probing dataset j up to u[k], shape (K, M, N).
    anchor:        L_i(theta_t), shape (M,).
    horizon:       H_t, steps until the next update.
    probe_budget:  c_t, probe steps, so the horizon is at u_H = H_t / c_t.
    Returns slopes with ``H_t * S_ij = f_ij(u_H) - L_i(theta_t)``, the predicted change.
    """
    u, trajectories, anchor = _check_trajectories(u, trajectories, anchor)
    _check_budget(probe_budget)
    if horizon < 1:
        raise ValueError(f"horizon must be a positive number of steps, got {horizon}")
    u_horizon = horizon / probe_budget

    _, m, n = trajectories.shape
    u_all = np.concatenate([[0.0], u])
    changes = np.empty((m, n))
    models = np.empty((m, n), dtype=object)
    guarded = np.zeros((m, n), dtype=bool)
    for i in range(m):
        for j in range(n):
            dy = np.concatenate([[0.0], trajectories[:, i, j] - anchor[i]])
            changes[i, j], models[i, j], guarded[i, j] = _predict_change(
                u_all, dy, anchor[i], u_horizon
            )
    return SlopeEstimate(slope_matrix=changes / horizon, models=models, guarded=guarded)


def linear_estimate(
    u: np.ndarray,
    trajectories: np.ndarray,
    anchor: np.ndarray,
    horizon: int,
    probe_budget: int,
) -> SlopeEstimate:
    """Eq. 3.2 behind the same signature as :func:`curve_slopes` (reads only u = 1)."""
    u, trajectories, anchor = _check_trajectories(u, trajectories, anchor)
    if u[-1] != 1.0:
        raise ValueError(
            "the linear predictor needs the evaluation at the end of the probe (u = 1), got u = "
            f"{u[-1]}"
        )
    slopes = linear_slopes(anchor, trajectories[-1], probe_budget)
    return SlopeEstimate(
        slope_matrix=slopes,
        models=np.full(slopes.shape, LINEAR, dtype=object),
        guarded=np.zeros(slopes.shape, dtype=bool),
    )


@dataclass(frozen=True)
class Predictor:
    """A slope predictor and how many evaluations it needs per probe (the last at c_t).

    fit: ``(u, trajectories, anchor, horizon, probe_budget) -> SlopeEstimate``, as
    :func:`curve_slopes`.
    """

    num_probe_evals: int
    fit: Callable[[np.ndarray, np.ndarray, np.ndarray, int, int], SlopeEstimate]

    def slopes(
        self,
        *,
        anchor: np.ndarray,
        checkpoints: np.ndarray,
        trajectories: np.ndarray,
        probe_budget: int,
        horizon: int,
    ) -> SlopeEstimate:
        """S(t) from evaluations taken ``checkpoints`` steps into each probe
        (:func:`probe_progress`); ``trajectories`` has shape (len(checkpoints), M, N)."""
        _check_budget(probe_budget)
        u = np.asarray(checkpoints, dtype=float) / probe_budget
        return self.fit(u, trajectories, anchor, horizon, probe_budget)


PREDICTORS: dict[str, Predictor] = {
    "linear": Predictor(num_probe_evals=1, fit=linear_estimate),
    "curve": Predictor(num_probe_evals=5, fit=curve_slopes),
}


def _check_budget(probe_budget: int) -> None:
    if probe_budget < 1:
        raise ValueError(
            f"probe_budget (c_t) must be a positive number of steps, got {probe_budget}"
        )


def _check_trajectories(
    u: np.ndarray, trajectories: np.ndarray, anchor: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    u = np.asarray(u, dtype=float)
    trajectories = np.asarray(trajectories, dtype=float)
    anchor = np.asarray(anchor, dtype=float)
    if u.ndim != 1 or u.size == 0 or u[0] <= 0 or u[-1] > 1 or np.any(np.diff(u) <= 0):
        raise ValueError(f"u must be a non-empty increasing sequence in (0, 1], got {u}")
    if trajectories.ndim != 3 or trajectories.shape[0] != u.size:
        raise ValueError(
            f"trajectories must have shape (K={u.size}, M, N), got {trajectories.shape}"
        )
    if anchor.shape != (trajectories.shape[1],):
        raise ValueError(f"anchor must have shape (M={trajectories.shape[1]},), got {anchor.shape}")
    if not (np.all(np.isfinite(trajectories)) and np.all(np.isfinite(anchor))):
        raise ValueError("anchor and trajectories must be finite numbers")
    return u, trajectories, anchor
