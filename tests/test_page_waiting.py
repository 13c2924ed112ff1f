"""The visible queue: runs take turns on the machine, and whoever waits sees their place and an estimate; Stop while
waiting leaves the queue and the runs behind move up. The queue alone, then the page's handler waiting in it."""

import threading

import pytest

from specdemo.ui import handlers, waiting
from specdemo.ui.lanes import cancel_run
from specdemo.ui.values import PageValues


def test_runs_take_turns_first_come_first_served():
    line = waiting.RunQueue(max_waiting=4)
    first, second, third = line.join(32), line.join(32), line.join(64)
    assert [line.ahead(t) for t in (first, second, third)] == [0, 1, 2]
    line.leave(first)
    assert [line.ahead(t) for t in (second, third)] == [0, 1]


def test_the_estimate_adds_what_the_runs_ahead_asked_for_at_the_recent_pace():
    line = waiting.RunQueue(max_waiting=4)
    running, middle, mine = line.join(100), line.join(50), line.join(10)
    pace = waiting.DEFAULT_SECONDS_PER_TOKEN
    assert line.estimate_s(mine) == pytest.approx(150 * pace, rel=0.05)  # the running one has barely begun
    assert line.estimate_s(running) == 0.0


def test_stop_while_waiting_leaves_the_queue_and_the_runs_behind_move_up():
    line = waiting.RunQueue(max_waiting=4)
    running, mine, behind = line.join(32), line.join(32), line.join(32)
    cancel = threading.Event()
    places = line.wait(mine, cancel)
    assert next(places)[0] == 1
    cancel.set()
    assert list(places) == []  # left at once
    assert line.ahead(behind) == 1 and len(line) == 2


def test_a_full_queue_refuses_with_a_sentence():
    line = waiting.RunQueue(max_waiting=1)
    line.join(8), line.join(8)
    with pytest.raises(waiting.QueueFull, match="1 runs are already waiting, the most this page takes"):
        line.join(8)


def test_the_waiting_status_says_how_many_runs_are_ahead_and_for_how_long():
    assert waiting.describe_place(3, 40.2).startswith("Waiting for the machine: 3 runs ahead of you, about 40 s.")
    assert "1 run ahead of you, any moment" in waiting.describe_place(1, 0.5)


def test_the_page_says_its_place_at_once_and_stop_leaves_the_queue(monkeypatch):
    line = waiting.RunQueue(max_waiting=4)
    monkeypatch.setattr(handlers, "LINE", line)
    holder = line.join(64)  # another visitor's run holds the machine
    views = handlers.generate(PageValues(instruction="Write a haiku."), session="visitor")
    assert next(views).status.startswith("Waiting for the machine: 1 run ahead of you")
    assert cancel_run("visitor")  # Stop
    assert [v.status for v in views] == [handlers.LEFT_QUEUE_STATUS]
    assert len(line) == 1 and line.ahead(holder) == 0
