import dataclasses

import numpy as np
import pytest

from specdec.schedule import Schedule, make_schedule


def test_vllm_example_gaps_and_tail_inherit_previous_k():
    schedule = make_schedule([(1, 16, 3), (32, 128, 2), (256, 256, 0)], max_num_drafts=3)
    expected = {1: 3, 16: 3, 17: 3, 31: 3, 32: 2, 128: 2, 256: 0, 1000: 0, 10**9: 0}
    expected.update({bs: 2 for bs in range(129, 256)})
    assert {bs: schedule(bs) for bs in expected} == expected


def test_seed_example_ranges():
    schedule = make_schedule([[1, 64, 3], [65, 128, 1], [129, 512, 0]], max_num_drafts=5)
    assert [schedule(bs) for bs in (1, 64, 65, 128, 129, 512, 513)] == [3, 3, 1, 1, 0, 0, 0]
    assert schedule.max_k == 3 and not schedule.is_constant


def test_lookup_matches_a_naive_scan():
    ranges = [(1, 3, 5), (4, 4, 4), (9, 20, 1), (40, 41, 2)]
    schedule = make_schedule(ranges, max_num_drafts=5)

    def naive(bs):
        k = None
        for start, _end, rk in ranges:
            if start <= bs:
                k = rk
        return k

    assert [schedule(bs) for bs in range(1, 100)] == [naive(bs) for bs in range(1, 100)]


def test_constant_k():
    schedule = make_schedule(4, max_num_drafts=10)
    assert schedule(1) == schedule(7) == schedule(4096) == 4
    assert schedule.is_constant and schedule.max_k == 4
    assert make_schedule(0, max_num_drafts=0)(3) == 0


def test_accepts_numpy_ints_and_is_frozen():
    schedule = make_schedule(np.array([[1, 8, 2], [9, 16, 1]]).tolist(), max_num_drafts=np.int64(2))
    assert schedule(9) == 1
    schedule = make_schedule([tuple(np.array([1, 4, 2]))], max_num_drafts=2)
    assert schedule(100) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.max_num_drafts = 5  # type: ignore[misc]
    assert isinstance(schedule, Schedule)


@pytest.mark.parametrize(
    "ranges, match",
    [
        ([[1, 4]], r"entry 0 .*3 ints"),
        ([[1, 4, 2, 7]], r"entry 0 .*3 ints"),
        ("[[1, 4, 2]]", r"parse JSON"),
        ([], r"empty"),
        ([[2, 4, 2]], r"entry 0 \[2, 4, 2\].*must start at batch size 1"),
        ([[0, 4, 2]], r"start_bs must be >= 1"),
        ([[1, 4, 2], [8, 5, 1]], r"entry 1 \[8, 5, 1\].*end_bs=5 is below start_bs=8"),
        ([[1, 8, 2], [8, 16, 1]], r"entry 1 \[8, 16, 1\].*overlaps.*> 8"),
        ([[1, 8, 2], [20, 30, 1], [9, 12, 1]], r"entry 2 \[9, 12, 1\].*sorted"),
        ([[1, 8, -1]], r"entry 0 .*K must be >= 0"),
        ([[1, 8, 2], [9, 16, 6]], r"entry 1 \[9, 16, 6\].*K=6 exceeds the drafter's max_num_drafts=5.*refuses"),
        (-1, r"constant K=-1.*K must be >= 0"),
        (6, r"constant K=6.*exceeds"),
    ],
)
def test_bad_schedules_name_the_entry_and_the_fix(ranges, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make_schedule(ranges, max_num_drafts=5)


def test_bad_types_and_arguments():
    with pytest.raises(TypeError, match=r"entry 0 .*K must be an int"):
        make_schedule([[1, 4, 2.5]], max_num_drafts=5)
    with pytest.raises(TypeError, match=r"bool"):
        make_schedule([[1, 4, True]], max_num_drafts=5)
    with pytest.raises(ValueError, match=r"max_num_drafts must be >= 0"):
        make_schedule(1, max_num_drafts=-1)
    schedule = make_schedule(2, max_num_drafts=2)
    with pytest.raises(ValueError, match=r"active_batch_size must be >= 1"):
        schedule(0)
