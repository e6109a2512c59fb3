"""Goodput arithmetic on hand-built timelines: exact seconds per category."""

import pytest

from jupyter_trainfactory.telemetry.goodput import (
    BADPUT_CATEGORIES,
    Attempt,
    CheckpointSave,
    Step,
    account,
)


def _steps(first_step, first_end, n, duration=1.0, wait=0.1):
    """``n`` back-to-back steps of ``duration`` s, the first ending at ``first_end``."""
    return [Step(first_end + k * duration, first_step + k, duration, wait) for k in range(n)]


def _total(acc):
    return acc.goodput_s + sum(acc.badput_s.values())


def test_one_failure_restored_from_the_last_checkpoint():
    # submitted at 0; workers start at 10; steps 1-10 end at 21..30; checkpoint of step 10
    # saved 30-32; steps 11-15 end at 33..37; failure at 37.5; restart at 45; steps 11-20
    # (restored from 10) end at 56..65; the job ends at 70.
    steps = _steps(1, 21, 10) + _steps(11, 33, 5) + _steps(11, 56, 10)
    acc = account(
        0.0,
        70.0,
        [Attempt(10.0, failed_at=37.5), Attempt(45.0)],
        steps,
        [CheckpointSave(30.0, 32.0, 10)],
    )
    assert acc.badput_s == pytest.approx(
        {
            "startup": 20.0,  # 0-10 scheduling, 10-20 until the first step starts
            "data_loading": 2.0,  # 10 kept steps x 0.1 s in each attempt
            "checkpoint_save": 2.0,  # 30-32
            "checkpoint_restore": 10.0,  # 45-55: restart to the first step
            "wasted_progress": 5.5,  # 32-37.5: after the checkpoint, lost
            "infrastructure_recovery": 7.5,  # 37.5-45
            "preemption": 0.0,
            "other": 5.0,  # 65-70 after the last step
        }
    )
    assert acc.goodput_s == pytest.approx((12 - 2 - 1) + (10 - 1))  # kept work - save - wait
    assert _total(acc) == pytest.approx(70.0) and acc.ettr == pytest.approx(18 / 70)
    (failure,) = acc.failures
    assert (failure.step_reached, failure.restored_step, failure.steps_lost) == (15, 10, 5)
    assert failure.mttr_s == pytest.approx(61.0 - 37.5)  # step 16 ends at 61
    metrics = acc.metrics()
    assert metrics["faults/count"] == 1.0 and metrics["faults/mttr_s"] == pytest.approx(23.5)
    assert metrics["badput/wasted_progress_s"] == 5.5
    assert metrics["goodput/ettr"] == pytest.approx(18 / 70)


def test_two_failures_a_preemption_and_slow_checkpoints():
    # attempt 0 (start 5): steps 1-4 end 11..14 (first starts at 10), slow save of step 4
    #   14-24, steps 5-6 end 25, 26; fails at 26.
    # attempt 1 (start 30): restored from step 4; steps 5-8 end 36..39 (first starts 35),
    #   preempted at 39 with no checkpoint in this attempt: all of 35-39 is lost.
    # attempt 2 (start 50): steps 5-10 end 53..58 (first starts 52), save of step 10 58-68,
    #   the job ends at 70.
    steps = (
        _steps(1, 11, 4, wait=0.0)
        + _steps(5, 25, 2, wait=0.0)
        + _steps(5, 36, 4, wait=0.0)
        + _steps(5, 53, 6, wait=0.5)
    )
    acc = account(
        0.0,
        70.0,
        [
            Attempt(5.0, failed_at=26.0),
            Attempt(30.0, failed_at=39.0, kind="preemption"),
            Attempt(50.0),
        ],
        steps,
        [CheckpointSave(14.0, 24.0, 4), CheckpointSave(58.0, 68.0, 10)],
    )
    assert acc.badput_s == pytest.approx(
        {
            "startup": 10.0,  # 0-10
            "data_loading": 3.0,  # attempt 2: 6 steps x 0.5 s
            "checkpoint_save": 20.0,  # 14-24 (kept), 58-68 (after the last step)
            "checkpoint_restore": 5.0 + 2.0,  # 30-35, 50-52
            "wasted_progress": 2.0 + 4.0,  # 24-26, 35-39
            "infrastructure_recovery": 4.0,  # 26-30
            "preemption": 11.0,  # 39-50
            "other": 2.0,  # 68-70
        }
    )
    assert acc.goodput_s == pytest.approx(4.0 + 6.0 - 3.0)  # 10-14, 52-58 minus waits
    assert _total(acc) == pytest.approx(70.0)
    first, second = acc.failures
    assert (first.kind, first.step_reached, first.restored_step) == ("failure", 6, 4)
    assert first.mttr_s == pytest.approx(38.0 - 26.0)  # step 7 is next reached at 38
    assert (second.kind, second.step_reached, second.restored_step) == ("preemption", 8, 4)
    assert second.steps_lost == 4 and second.mttr_s == pytest.approx(57.0 - 39.0)  # step 9


def test_a_job_still_starting_is_all_startup():
    acc = account(100.0, 160.0, [], [])
    assert acc.badput_s["startup"] == 60.0 and acc.goodput_s == 0 and acc.ettr == 0
    acc = account(100.0, 160.0, [Attempt(130.0)], [])
    assert acc.badput_s["startup"] == 60.0 and set(acc.badput_s) == set(BADPUT_CATEGORIES)


def test_a_failure_not_yet_recovered_has_no_mttr():
    acc = account(0.0, 30.0, [Attempt(0.0, failed_at=25.0)], _steps(1, 11, 10))
    (failure,) = acc.failures
    assert failure.mttr_s is None and "faults/mttr_s" not in acc.metrics()
    assert acc.badput_s["wasted_progress"] == 15.0  # no checkpoint: 10-25 all lost
    assert acc.badput_s["infrastructure_recovery"] == 5.0 and _total(acc) == 30.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"submitted": 10.0, "ended": 5.0, "attempts": []},
        {"submitted": 0.0, "ended": 9.0, "attempts": [Attempt(5.0), Attempt(2.0)]},
        {"submitted": 3.0, "ended": 9.0, "attempts": [Attempt(1.0)]},
        {"submitted": 0.0, "ended": 9.0, "attempts": [Attempt(5.0, failed_at=2.0)]},
    ],
)
def test_inconsistent_timelines_raise(kwargs):
    with pytest.raises(ValueError):
        account(steps=[], **kwargs)
