"""Goodput arithmetic on hand-built timelines: exact seconds per category."""

import json

import pytest

from jupyter_trainfactory.telemetry.goodput import (
    BADPUT_CATEGORIES,
    CATEGORY_CODES,
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
            "user_error": 0.0,
            "drill": 0.0,
            "stop_wait": 0.0,
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


def _two_failures(kinds=("failure", "preemption")):
    """Two failures, the second a preemption (``kinds``: the two ``Attempt.kind``), and
    slow checkpoint saves (0-70 s)."""
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
    return account(
        0.0,
        70.0,
        [
            Attempt(5.0, failed_at=26.0, kind=kinds[0]),
            Attempt(30.0, failed_at=39.0, kind=kinds[1]),
            Attempt(50.0),
        ],
        steps,
        [CheckpointSave(14.0, 24.0, 4), CheckpointSave(58.0, 68.0, 10)],
    )


def test_two_failures_a_preemption_and_slow_checkpoints():
    acc = _two_failures()
    assert acc.badput_s == pytest.approx(
        {
            "startup": 10.0,  # 0-10
            "data_loading": 3.0,  # attempt 2: 6 steps x 0.5 s
            "checkpoint_save": 20.0,  # 14-24 (kept), 58-68 (after the last step)
            "checkpoint_restore": 5.0 + 2.0,  # 30-35, 50-52
            "wasted_progress": 2.0 + 4.0,  # 24-26, 35-39
            "infrastructure_recovery": 4.0,  # 26-30
            "preemption": 11.0,  # 39-50
            "user_error": 0.0,
            "drill": 0.0,
            "stop_wait": 0.0,
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


def test_a_user_error_and_a_drill_are_booked_as_theirs_never_as_infrastructure():
    """The training code's own exception is the user's: its lost work and the restart
    after it are ``user_error`` (``cost/user_error_usd``); an injected failure's are
    ``drill``. Neither is wasted progress or infrastructure recovery (issue 48, 8)."""
    acc = _two_failures(kinds=("user_error", "drill"))
    bad = acc.badput_s
    assert bad["user_error"] == pytest.approx(2.0 + 4.0)  # 24-26 lost, 26-30 the restart
    assert bad["drill"] == pytest.approx(4.0 + 11.0)  # 35-39 lost, 39-50 the recovery
    assert bad["infrastructure_recovery"] == bad["wasted_progress"] == bad["preemption"] == 0
    assert bad["checkpoint_restore"] == pytest.approx(7.0) and _total(acc) == pytest.approx(70.0)
    assert [f.kind for f in acc.failures] == ["user_error", "drill"]
    assert acc.failures[0].steps_lost == 2 and acc.failures[1].steps_lost == 4
    codes = {code for _, _, code in acc.timeline()["segments"]}
    assert {"ue", "dr"} <= codes and not {"ir", "wp", "pe"} & codes


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


def _tiles(acc):
    return [(s.start, s.end, s.category) for s in acc.segments]


def _assert_tiles_sum_to_totals(acc):
    """No gaps, no overlaps, no two neighbours alike; each category's lengths add up."""
    segments = acc.segments
    assert segments[0].start == acc.submitted
    assert segments[-1].end == pytest.approx(acc.submitted + acc.wall_s)
    for a, b in zip(segments, segments[1:], strict=False):
        assert a.end == b.start and a.category != b.category and a.end > a.start
    for category in ("goodput", *BADPUT_CATEGORIES):
        total = sum(s.length for s in segments if s.category == category)
        expected = acc.goodput_s if category == "goodput" else acc.badput_s[category]
        assert total == pytest.approx(expected, abs=1e-9), category


def test_segments_of_two_failures_a_preemption_and_slow_checkpoints():
    acc = _two_failures()
    assert _tiles(acc) == [
        (0.0, 10.0, "startup"),
        (10.0, 14.0, "goodput"),
        (14.0, 24.0, "checkpoint_save"),
        (24.0, 26.0, "wasted_progress"),
        (26.0, 30.0, "infrastructure_recovery"),
        (30.0, 35.0, "checkpoint_restore"),
        (35.0, 39.0, "wasted_progress"),
        (39.0, 50.0, "preemption"),
        (50.0, 52.0, "checkpoint_restore"),
        (52.0, 55.0, "data_loading"),  # 6 steps x 0.5 s, placed at the piece's start
        (55.0, 58.0, "goodput"),
        (58.0, 68.0, "checkpoint_save"),
        (68.0, 70.0, "other"),
    ]
    _assert_tiles_sum_to_totals(acc)


def test_data_loading_goes_to_the_start_of_each_piece_between_saves():
    # one attempt from 10: steps of 1 s (0.25 s waiting for data) end 11, 12 | save 12-13 |
    # 14, 15 | save 15-17 | 18; the job ends at 20.
    steps = _steps(1, 11, 2, wait=0.25) + _steps(3, 14, 2, wait=0.25) + [Step(18.0, 5, 1.0, 0.25)]
    saves = [CheckpointSave(12.0, 13.0, 2), CheckpointSave(15.0, 17.0, 4)]
    acc = account(0.0, 20.0, [Attempt(10.0)], steps, saves)
    assert _tiles(acc) == [
        (0.0, 10.0, "startup"),
        (10.0, 10.5, "data_loading"),
        (10.5, 12.0, "goodput"),
        (12.0, 13.0, "checkpoint_save"),
        (13.0, 13.5, "data_loading"),
        (13.5, 15.0, "goodput"),
        (15.0, 17.0, "checkpoint_save"),
        (17.0, 17.25, "data_loading"),
        (17.25, 18.0, "goodput"),
        (18.0, 20.0, "other"),
    ]
    assert acc.badput_s["data_loading"] == 1.25 and acc.goodput_s == 3.75
    _assert_tiles_sum_to_totals(acc)


def test_data_loading_that_does_not_fit_its_piece_goes_to_an_earlier_one():
    # step 1 ends 12 (from 10); an asynchronous save 12-14 while step 2 (12-15) waits 2.5 s
    # for data: its piece 14-15 holds 1 s, the other 1.5 s go to 10-12. The total is the
    # attempt's: min(2.5, kept 5 - saves 2) = 2.5 s.
    steps = [Step(12.0, 1, 2.0, 0.0), Step(15.0, 2, 3.0, 2.5)]
    acc = account(0.0, 16.0, [Attempt(10.0)], steps, [CheckpointSave(12.0, 14.0, 1)])
    assert _tiles(acc) == [
        (0.0, 10.0, "startup"),
        (10.0, 11.5, "data_loading"),
        (11.5, 12.0, "goodput"),
        (12.0, 14.0, "checkpoint_save"),
        (14.0, 15.0, "data_loading"),
        (15.0, 16.0, "other"),
    ]
    assert acc.badput_s["data_loading"] == 2.5 and acc.goodput_s == 0.5
    _assert_tiles_sum_to_totals(acc)


def test_segments_of_the_other_timelines_tile_them():
    steps = _steps(1, 21, 10) + _steps(11, 33, 5) + _steps(11, 56, 10)
    attempts = [Attempt(10.0, failed_at=37.5), Attempt(45.0)]
    acc = account(0.0, 70.0, attempts, steps, [CheckpointSave(30.0, 32.0, 10)])
    assert _tiles(acc)[:4] == [
        (0.0, 20.0, "startup"),
        (20.0, 21.0, "data_loading"),
        (21.0, 30.0, "goodput"),
        (30.0, 32.0, "checkpoint_save"),
    ]
    _assert_tiles_sum_to_totals(acc)
    acc = account(100.0, 160.0, [], [])
    assert _tiles(acc) == [(100.0, 160.0, "startup")]
    assert account(5.0, 5.0, [Attempt(5.0)], []).segments == []


def test_timeline_is_compact_and_relative():
    acc = _two_failures()
    assert acc.timeline() == {
        "t0": 0.0,
        "wall_s": 70.0,
        "segments": [
            [0.0, 10.0, "su"],
            [10.0, 14.0, "g"],
            [14.0, 24.0, "cs"],
            [24.0, 26.0, "wp"],
            [26.0, 30.0, "ir"],
            [30.0, 35.0, "cr"],
            [35.0, 39.0, "wp"],
            [39.0, 50.0, "pe"],
            [50.0, 52.0, "cr"],
            [52.0, 55.0, "dl"],
            [55.0, 58.0, "g"],
            [58.0, 68.0, "cs"],
            [68.0, 70.0, "ot"],
        ],
        "failures": [[26.0, "failure"], [39.0, "preemption"]],
    }
    assert set(CATEGORY_CODES) == {"goodput", *BADPUT_CATEGORIES}
    assert len(set(CATEGORY_CODES.values())) == len(CATEGORY_CODES)


def test_timeline_merges_the_shortest_segments_into_their_longer_neighbours():
    # shortest first: wp 24-26 into cs, cr 50-52 into pe, ot into cs, dl then g 55-58 into
    # pe, g 10-14 into cs 14-26 (longer than su), ir into cs.
    timeline = _two_failures().timeline(max_segments=6)
    assert timeline["segments"] == [
        [0.0, 10.0, "su"],
        [10.0, 30.0, "cs"],
        [30.0, 35.0, "cr"],
        [35.0, 39.0, "wp"],
        [39.0, 58.0, "pe"],
        [58.0, 70.0, "cs"],
    ]
    assert _two_failures().timeline(max_segments=1)["segments"] == [[0.0, 70.0, "pe"]]
    with pytest.raises(ValueError):
        _two_failures().timeline(max_segments=0)


def test_a_pathological_timeline_fits_an_mlflow_tag():
    # 2,000 ten-minute steps, each followed by a one-minute save, and 300 failures after
    # them; submitted at an epoch time; about 15 days of wall time.
    t0 = 1.7e9
    steps, saves, t = [], [], t0 + 120.0
    for k in range(2000):
        t += 600.0
        steps.append(Step(t, k + 1, 600.0, 5.0))
        saves.append(CheckpointSave(t, t + 60.0, k + 1))
        t += 60.0
    attempts = [Attempt(t0 + 60.0, failed_at=t)]
    for _ in range(300):
        attempts.append(Attempt(t + 30.0, failed_at=t + 40.0, kind="preemption"))
        t += 50.0
    attempts.append(Attempt(t))
    acc = account(t0, t + 100.0, attempts, steps, saves)
    assert len(acc.segments) > 6000
    _assert_tiles_sum_to_totals(acc)
    timeline = acc.timeline()
    assert len(json.dumps(timeline)) < 5000
    segments = timeline["segments"]
    assert len(segments) <= 120 and segments[0][0] == 0.0
    assert segments[-1][1] == round(acc.wall_s, 1) and timeline["t0"] == t0
    assert all(a[1] == b[0] and a[2] != b[2] for a, b in zip(segments, segments[1:], strict=False))
    assert len(timeline["failures"]) == 30  # the latest
    assert timeline["failures"][-1] == [round(acc.failures[-1].time - t0, 1), "preemption"]


def test_a_failure_record_has_its_detection_and_restore_times():
    steps = _steps(1, 21, 10) + _steps(11, 33, 5) + _steps(11, 56, 10)
    attempts = [Attempt(10.0, failed_at=37.5, detected_at=39.0), Attempt(45.0)]
    (failure,) = account(0.0, 70.0, attempts, steps, [CheckpointSave(30.0, 32.0, 10)]).failures
    assert failure.time == 37.5 and failure.detected == 39.0
    assert failure.restored == pytest.approx(55.0)  # the first step after it starts at 55
    (undetected,) = account(0.0, 40.0, [Attempt(10.0, failed_at=37.5)], steps[:15]).failures
    assert undetected.detected == 37.5 and undetected.restored is None


def test_steps_of_surviving_ranks_after_a_failure_are_not_a_recovery():
    # step 16 ends at 38, after the failure at 37.5 (a rank that has not noticed yet);
    # recovery is measured on the restarted workers' steps: step 16 again ends at 61
    steps = _steps(1, 21, 10) + _steps(11, 33, 5) + [Step(38.0, 16, 1.0)]
    steps += _steps(11, 56, 10)
    attempts = [Attempt(10.0, failed_at=37.5), Attempt(45.0)]
    (failure,) = account(0.0, 70.0, attempts, steps, [CheckpointSave(30.0, 32.0, 10)]).failures
    assert failure.mttr_s == pytest.approx(61.0 - 37.5)
    assert failure.restored == pytest.approx(55.0)
