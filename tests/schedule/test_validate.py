from __future__ import annotations

import pytest

from perseus.errors import ScheduleError
from perseus.schedule import Action, Kind, format_grid, one_f_one_b, schedule_from_actions


def _acts(sched):
    return [list(ra) for ra in sched.rank_actions]


def test_valid_schedule_round_trips():
    base = one_f_one_b(3, 4)
    again = schedule_from_actions("custom", _acts(base), 3, 4)
    assert again.rank_actions == base.rank_actions
    assert again.stage_to_rank == (0, 1, 2)


def test_missing_action_is_named():
    acts = _acts(one_f_one_b(3, 4))
    acts[1].remove(Action(1, Kind.B, 2))
    with pytest.raises(ScheduleError, match=r"1B2 .*missing from rank 1"):
        schedule_from_actions("x", acts, 3, 4)


def test_duplicate_is_marked_in_grid():
    acts = _acts(one_f_one_b(2, 2))
    acts[0].append(Action(0, Kind.F, 1))
    with pytest.raises(ScheduleError) as info:
        schedule_from_actions("x", acts, 2, 2)
    text = str(info.value)
    assert "0F1 appears 2 times" in text
    assert "0F1!" in text and "Rank 0" in text and "Step 00" in text


def test_misplaced_action():
    acts = _acts(one_f_one_b(2, 2))
    acts[0].append(acts[1].pop())
    with pytest.raises(ScheduleError, match="belongs to rank 1"):
        schedule_from_actions("x", acts, 2, 2, stage_to_rank=(0, 1))


def test_out_of_range_microbatch():
    acts = _acts(one_f_one_b(2, 2))
    acts[0][0] = Action(0, Kind.F, 7)
    with pytest.raises(ScheduleError, match="out of range"):
        schedule_from_actions("x", acts, 2, 2, stage_to_rank=(0, 1))


def test_deadlock_is_detected_and_marked():
    acts = _acts(one_f_one_b(2, 2))
    # Last rank runs B0 before F0: B0 needs F0 of the same rank -> stuck forever.
    acts[1] = [
        Action(1, Kind.B, 0),
        Action(1, Kind.F, 0),
        Action(1, Kind.F, 1),
        Action(1, Kind.B, 1),
    ]
    with pytest.raises(ScheduleError) as info:
        schedule_from_actions("x", acts, 2, 2)
    text = str(info.value)
    assert text.startswith("schedule deadlocks")
    assert "rank 1 waits at 1B0 for 1F0" in text
    assert "1B0!" in text


def test_cross_rank_deadlock():
    acts = _acts(one_f_one_b(2, 2))
    # Rank 0 waits for B0 from rank 1 before it sends F1; rank 1 needs F1 before B0.
    acts[0] = [
        Action(0, Kind.F, 0),
        Action(0, Kind.B, 0),
        Action(0, Kind.F, 1),
        Action(0, Kind.B, 1),
    ]
    acts[1] = [
        Action(1, Kind.F, 0),
        Action(1, Kind.F, 1),
        Action(1, Kind.B, 0),
        Action(1, Kind.B, 1),
    ]
    with pytest.raises(ScheduleError, match="deadlocks"):
        schedule_from_actions("x", acts, 2, 2)


def test_weight_actions_must_be_complete():
    acts = _acts(one_f_one_b(2, 2))
    acts[0].append(Action(0, Kind.W, 0))
    with pytest.raises(ScheduleError, match=r"0W1 .*missing"):
        schedule_from_actions("x", acts, 2, 2)


def test_grid_shows_a_window_around_the_marked_cells_of_a_long_schedule():
    acts = _acts(one_f_one_b(2, 12))
    # Rank 1 runs 1B11 before its 1F11: stuck at its last steps, far from the start.
    acts[1][-2], acts[1][-1] = acts[1][-1], acts[1][-2]
    with pytest.raises(ScheduleError, match="deadlocks") as info:
        schedule_from_actions("x", acts, 2, 12)
    assert str(info.value).splitlines()[1:] == [
        "         Rank 0  Rank 1",
        "...",
        "Step 18  0B8     1F9",
        "Step 19  0F10    1B9",
        "Step 20  0B9     1F10",
        "Step 21  0F11    1B10",
        "Step 22  0B10    1B11!",
        "Step 23  0B11!   1F11",
    ]


def test_format_grid_labels_columns_and_leaves_gaps_empty():
    text = format_grid(
        ([Action(0, Kind.F, 0), Action(0, Kind.B, 0)], [None, "x"]),
        [(1, 1)],
        labels=("planned", "ran"),
    )
    assert text.splitlines() == [
        "         planned  ran",
        "Step 00  0F0",
        "Step 01  0B0      x!",
    ]
