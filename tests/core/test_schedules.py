"""Update schedules: presets, fixed intervals, user lists, scaling and errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamics.core.schedules import PRESETS, ScheduleError, build_schedule


def test_paper_presets_at_2048_steps():
    dense = build_schedule("dense-warmup", 2048)
    assert dense.steps == (0, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    assert dense.horizons == (2, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    # c_t = min(H_t, 128): c = 2 at the first dense update, the full budget later.
    assert dense.probe_budgets == (2, 2, 4, 8, 16, 32, 64, 128, 128, 128, 128)
    assert len(build_schedule("no-warmup", 2048)) == 6
    assert len(build_schedule("light-warmup", 2048)) == 9
    # The last update's horizon runs to the end of training (docs/method.md).
    assert dense.horizon(1024) == 1024 and dense.probe_budget(1024) == 128


def test_fixed_interval_probes_for_the_whole_interval():
    for interval, updates in ((128, 16), (256, 8), (512, 4)):
        schedule = build_schedule(f"fixed:{interval}", 2048)
        assert len(schedule) == updates
        assert set(schedule.horizons) == {interval}
        assert set(schedule.probe_budgets) == {interval}  # c_t = H even above c_max


def test_scaling_rule_for_other_run_lengths():
    half = build_schedule("no-warmup", 1024)
    assert half.steps == (0, 32, 64, 128, 256, 512)
    assert half.probe_budgets[-1] == 64  # c_max = 128 scaled by 1024 / 2048
    tiny = build_schedule("dense-warmup", 256)
    assert tiny.steps == (0, 1, 2, 4, 8, 16, 32, 64, 128)  # 2 * 1/8 rounds to 0, deduplicated
    assert build_schedule("no-warmup", 2048, probe_cap=64).probe_budgets[-1] == 64


@given(
    total=st.integers(min_value=1, max_value=20_000),
    preset=st.sampled_from(sorted(PRESETS)),
    cap=st.one_of(st.none(), st.integers(min_value=1, max_value=512)),
)
def test_schedules_are_well_formed(total, preset, cap):
    schedule = build_schedule(preset, total, cap)
    assert schedule.steps[0] == 0
    assert all(a < b for a, b in zip(schedule.steps, schedule.steps[1:], strict=False))
    assert schedule.steps[-1] < total
    assert sum(schedule.horizons) == total
    assert all(1 <= c <= h for c, h in zip(schedule.probe_budgets, schedule.horizons, strict=True))


def test_probe_min_lengthens_only_the_shorter_probes():
    # The dense warmup at 256 steps: its first updates decide 1, 1, 2 and 4 steps, probed
    # over 8; the later probes, already 8 or longer, keep their budgets.
    schedule = build_schedule("dense-warmup", 256, probe_min=8)
    assert schedule.horizons == (1, 1, 2, 4, 8, 16, 32, 64, 128)
    assert schedule.probe_budgets == (8, 8, 8, 8, 8, 16, 16, 16, 16)
    assert schedule.probe_min == 8
    assert build_schedule([0, 3, 50], 100, probe_cap=20, probe_min=5).probe_budgets == (5, 20, 20)
    assert build_schedule("dense-warmup", 256).probe_budgets == (1, 1, 2, 4, 8, 16, 16, 16, 16)


@pytest.mark.parametrize("probe_min", [0, 17, True, 2.5])
def test_probe_min_outside_one_to_the_cap_is_refused(probe_min):
    with pytest.raises(
        ScheduleError, match=r"probe_min must be a whole number of steps from 1 to probe_cap \(16\)"
    ):
        build_schedule("dense-warmup", 256, probe_min=probe_min)


def test_user_list():
    schedule = build_schedule([0, 10, 50], 100, probe_cap=20)
    assert schedule.horizons == (10, 40, 50)
    assert schedule.probe_budgets == (10, 20, 20)


@pytest.mark.parametrize(
    ("spec", "total", "message"),
    [
        ("dense", 2048, "unknown schedule"),
        ("fixed:0", 2048, "positive integer"),
        ("fixed:abc", 2048, "positive integer"),
        ("fixed:4096", 2048, "longer than the run"),
        ([], 100, "empty"),
        ([1, 10], 100, "start at step 0"),
        ([0, 10, 10], 100, "strictly increasing"),
        ([0, 100], 100, "before the end"),
        ([0, 2.5], 100, "not an integer"),
    ],
)
def test_invalid_schedules_have_clear_errors(spec, total, message):
    with pytest.raises(ScheduleError, match=message) as error:
        build_schedule(spec, total)
    assert error.value.argument == "spec"


def test_invalid_lengths_and_caps():
    # Each error names the argument that is wrong, for a caller to name its own field.
    for kwargs, argument in (
        ({"total_steps": 0}, "total_steps"),
        ({"total_steps": 100, "probe_cap": 0}, "probe_cap"),
        ({"total_steps": 100, "probe_cap": 4, "probe_min": 5}, "probe_min"),
    ):
        with pytest.raises(ScheduleError, match=argument) as error:
            build_schedule("no-warmup", **kwargs)
        assert error.value.argument == argument
    with pytest.raises(KeyError, match="not an update step"):
        build_schedule("no-warmup", 2048).horizon(5)
