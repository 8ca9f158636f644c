"""Update schedules U, horizons H_t and probe budgets c_t (paper sections 4.3 and appendix I).

Presets are stated for the paper's 2,048-step runs. For another run length T they are
scaled by the documented rule in :func:`scale_steps`: every update step is multiplied by
T / 2048 and rounded to the nearest integer, duplicates are dropped, and the probe cap
c_max = 128 is scaled by the same factor (at least 1), so the cost of probing relative to
training (appendix H) is the same at every run length.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

PAPER_TOTAL_STEPS = 2048
PAPER_PROBE_CAP = 128

# Steps of the three geometric presets at the paper's 2,048-step run length (section 4.3).
PRESETS: dict[str, tuple[int, ...]] = {
    "no-warmup": (0, 64, 128, 256, 512, 1024),
    "light-warmup": (0, 8, 16, 32, 64, 128, 256, 512, 1024),
    "dense-warmup": (0, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
}

SCHEDULE_HELP = (
    "use one of 'no-warmup', 'light-warmup', 'dense-warmup', 'fixed:H' (H a positive integer), "
    "or a list of increasing update steps starting at 0"
)


class ScheduleError(ValueError):
    """An update schedule that cannot be used; the message says how to fix it, and
    ``argument`` names the argument of :func:`build_schedule` that is wrong."""

    def __init__(self, message: str, argument: str = "spec") -> None:
        super().__init__(message)
        self.argument = argument


@dataclass(frozen=True)
class UpdateSchedule:
    """Update steps U with their horizons and probe budgets.

    ``probe_budgets[k] = max(min(H_k, probe_cap), probe_min)`` for geometric and user
    schedules, and ``H`` for fixed-interval schedules (appendix I: c_t = H_t = H). A probe
    longer than its update's horizon measures its slopes over more steps than the update
    decides; it is rolled back as every probe is.
    """

    name: str
    total_steps: int
    steps: tuple[int, ...]
    horizons: tuple[int, ...]
    probe_budgets: tuple[int, ...]
    probe_min: int = 1

    def horizon(self, step: int) -> int:
        return self.horizons[self._index(step)]

    def probe_budget(self, step: int) -> int:
        return self.probe_budgets[self._index(step)]

    def _index(self, step: int) -> int:
        try:
            return self.steps.index(step)
        except ValueError:
            raise KeyError(f"step {step} is not an update step of schedule {self.name!r}") from None

    def __contains__(self, step: object) -> bool:
        return step in self.steps

    def __len__(self) -> int:
        return len(self.steps)


def scale_steps(steps: Sequence[int], total_steps: int) -> tuple[int, ...]:
    """Scale preset steps stated for 2,048 steps to ``total_steps`` (module docstring)."""
    factor = total_steps / PAPER_TOTAL_STEPS
    scaled = sorted({round(s * factor) for s in steps})
    return tuple(s for s in scaled if s < total_steps)


def scaled_probe_cap(total_steps: int) -> int:
    """c_max = 128 at 2,048 steps, scaled proportionally (at least 1)."""
    return max(1, round(PAPER_PROBE_CAP * total_steps / PAPER_TOTAL_STEPS))


def _horizons(steps: Sequence[int], total_steps: int) -> tuple[int, ...]:
    # The last update's horizon runs to the end of training (docs/method.md).
    ends = [*steps[1:], total_steps]
    return tuple(end - start for start, end in zip(steps, ends, strict=True))


def build_schedule(
    spec: str | Sequence[int], total_steps: int, probe_cap: int | None = None, probe_min: int = 1
) -> UpdateSchedule:
    """Build the schedule named by ``spec`` for a run of ``total_steps`` steps.

    ``probe_cap`` is c_max; None means the paper's 128 scaled to the run length.
    ``probe_min`` is the fewest steps a probe trains (1: the paper's budgets, each update's
    horizon up to c_max): a dense warmup's first updates decide one or two steps each, and
    ``probe_min`` lets their probes measure more steps than that. Both are ignored by
    ``fixed:H`` schedules, whose probe budget is always H.
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ScheduleError(
            f"total_steps must be a positive integer, got {total_steps!r}", "total_steps"
        )
    if probe_cap is not None and (
        isinstance(probe_cap, bool) or not isinstance(probe_cap, int) or probe_cap < 1
    ):
        raise ScheduleError(
            f"probe_cap must be a positive integer (c_max), got {probe_cap!r}", "probe_cap"
        )
    cap = scaled_probe_cap(total_steps) if probe_cap is None else probe_cap
    if isinstance(probe_min, bool) or not isinstance(probe_min, int) or not 1 <= probe_min <= cap:
        raise ScheduleError(
            f"probe_min must be a whole number of steps from 1 to probe_cap ({cap}), got "
            f"{probe_min!r}",
            "probe_min",
        )

    def budgets_of(horizons: Sequence[int]) -> tuple[int, ...]:
        return tuple(max(min(h, cap), probe_min) for h in horizons)

    if isinstance(spec, str):
        text = spec.strip()
        if text in PRESETS:
            steps = scale_steps(PRESETS[text], total_steps)
            horizons = _horizons(steps, total_steps)
            return UpdateSchedule(
                text, total_steps, steps, horizons, budgets_of(horizons), probe_min
            )
        if text.startswith("fixed:"):
            value = text.split(":", 1)[1]
            if not value.isdigit() or int(value) < 1:
                raise ScheduleError(
                    f"schedule {spec!r}: the interval H in 'fixed:H' must be a positive integer"
                )
            interval = int(value)
            if interval > total_steps:
                raise ScheduleError(
                    f"schedule {spec!r}: the interval {interval} is longer than the run "
                    f"({total_steps} steps)"
                )
            steps = tuple(range(0, total_steps, interval))
            horizons = _horizons(steps, total_steps)
            # Appendix I: c_t = H for every update, including a shorter final interval.
            budgets = tuple(min(interval, h) for h in horizons)
            return UpdateSchedule(text, total_steps, steps, horizons, budgets)
        raise ScheduleError(f"unknown schedule {spec!r}: {SCHEDULE_HELP}")

    steps_list = list(spec)
    if not steps_list:
        raise ScheduleError(f"the schedule is an empty list: {SCHEDULE_HELP}")
    for s in steps_list:
        if isinstance(s, bool) or not isinstance(s, int):
            raise ScheduleError(f"schedule step {s!r} is not an integer: {SCHEDULE_HELP}")
    if steps_list[0] != 0:
        raise ScheduleError(
            f"the schedule must start at step 0 (got {steps_list[0]}): the first mixture is chosen "
            "before training"
        )
    if any(b <= a for a, b in itertools.pairwise(steps_list)):
        raise ScheduleError(f"schedule steps must be strictly increasing, got {steps_list}")
    if steps_list[-1] >= total_steps:
        raise ScheduleError(
            f"schedule step {steps_list[-1]} is not before the end of training ({total_steps} "
            "steps)"
        )
    steps = tuple(steps_list)
    horizons = _horizons(steps, total_steps)
    return UpdateSchedule("custom", total_steps, steps, horizons, budgets_of(horizons), probe_min)
