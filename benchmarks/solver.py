"""Wall time of one mixture update's solve: the full 45-point (lambda, eps) grid of eq. 3.4.

Goal: under 50 ms for N = M = 20 on a 2-core machine, so the solver stays negligible next
to the probes (paper section 3.3: "the cost of these computations is negligible").

    .venv/bin/python benchmarks/solver.py [--datasets 20] [--domains 20] [--problems 20]
        [--repeats 5]

Prints one JSON object. The problems are random but shaped like real updates: slopes of
order 1e-3 loss per step, targets helped by some datasets, half the domains constrained
with references a little above or below the current loss, horizon 64. The machine is
shared and noisy, so the median over problems x repeats is the number to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from dynamics.core.problem import MixtureProblem
from dynamics.core.solver import solve, solve_penalized

GOAL_MS = 50.0


def random_problem(rng: np.random.Generator, num_datasets: int, num_domains: int) -> MixtureProblem:
    """An update with half the domains targets and half constraints (see module docstring)."""
    num_constraints = num_domains // 2
    num_targets = num_domains - num_constraints
    slopes = rng.normal(0.0, 1e-3, size=(num_domains, num_datasets))
    # Targets are helped by training on (some) datasets: their losses tend to go down.
    slopes[:num_targets] -= 5e-4 * rng.random((num_targets, num_datasets))
    current_losses = rng.uniform(1.5, 3.0, size=num_domains)
    reference_losses = np.full(num_domains, np.nan)
    reference_losses[num_targets:] = current_losses[num_targets:] + rng.uniform(
        -0.02, 0.05, num_constraints
    )
    return MixtureProblem(
        slopes=slopes,
        current_losses=current_losses,
        reference_losses=reference_losses,
        targets=tuple(range(num_targets)),
        constraints=tuple(range(num_targets, num_domains)),
        horizon=64.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=20, help="N, fine-tuning datasets")
    parser.add_argument("--domains", type=int, default=20, help="M, evaluation domains")
    parser.add_argument("--problems", type=int, default=20, help="distinct random problems")
    parser.add_argument("--repeats", type=int, default=5, help="timed solves of each problem")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    problems = [random_problem(rng, args.datasets, args.domains) for _ in range(args.problems)]
    solve(problems[0])  # warm-up: first calls into scipy/LAPACK pay one-off set-up costs

    grid_ms: list[float] = []
    feasible = 0
    for _ in range(args.repeats):
        for problem in problems:
            start = time.perf_counter()
            solution = solve(problem)
            grid_ms.append(1e3 * (time.perf_counter() - start))
            feasible += solution.feasible
    num_candidates = solution.num_candidates

    # One penalised solve without a warm start, at every grid point of a few problems:
    # what a single candidate costs when it cannot lean on its neighbour.
    cold_ms: list[float] = []
    for problem in problems[:3]:
        for eps in problem.grid.epsilons:
            for lam in problem.grid.lambdas:
                start = time.perf_counter()
                solve_penalized(problem, lam, eps)
                cold_ms.append(1e3 * (time.perf_counter() - start))

    median_ms = statistics.median(grid_ms)
    print(
        json.dumps(
            {
                "benchmark": "solver.full_grid",
                "N": args.datasets,
                "M": args.domains,
                "constraints": args.domains // 2,
                "candidates_per_grid": num_candidates,
                "problems": args.problems,
                "repeats": args.repeats,
                "grid_solve_ms_median": round(median_ms, 3),
                "grid_solve_ms_mean": round(statistics.fmean(grid_ms), 3),
                "grid_solve_ms_max": round(max(grid_ms), 3),
                "penalized_solve_ms_in_grid_mean": round(
                    statistics.fmean(grid_ms) / num_candidates, 4
                ),
                "penalized_solve_ms_cold_median": round(statistics.median(cold_ms), 4),
                "goal_ms": GOAL_MS,
                "median_over_goal": round(median_ms / GOAL_MS, 3),
                "feasible_fraction": round(feasible / len(grid_ms), 3),
                # Other jobs on a shared machine inflate the timings; this says how busy it was.
                "load_average_1min": round(os.getloadavg()[0], 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
