"""The visible queue: runs take turns on the machine, and whoever waits sees their place and an estimate; Stop while
waiting leaves the queue and the runs behind move up. The queue alone, then the page's handler waiting in it."""

import threading

import pytest

from specdemo.serve import waiting
from specdemo.ui import handlers
from specdemo.serve.server import Server
from specdemo.serve.values import PageValues
from specdemo.serve.visitors import Visitor, address_of, visitor_of


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


def test_the_page_says_its_place_at_once_and_stop_leaves_the_queue():
    server = Server(line=waiting.RunQueue(max_waiting=4))
    line = server.line
    holder = line.join(64)  # another visitor's run holds the machine
    views = handlers.generate(server, PageValues(instruction="Write a haiku."), Visitor("visitor", "10.0.0.7"))
    first = next(views)
    assert first.status.startswith("Waiting for the machine: 1 run ahead of you")
    assert server.runs.cancel("visitor", first.run)  # Stop, naming the run the page was told
    assert [v.status for v in views] == [handlers.LEFT_QUEUE_STATUS]
    assert len(line) == 1 and line.ahead(holder) == 0


def test_one_session_holds_one_place_and_one_address_a_few():
    line = waiting.RunQueue(max_waiting=32)
    line.join(8, Visitor("tab-1", "10.0.0.7"))
    with pytest.raises(waiting.QueueFull, match="your previous run is still running or waiting"):
        line.join(8, Visitor("tab-1", "10.0.0.7"))
    for i in range(2, waiting.PER_ADDRESS + 1):  # the same address with new sessions: a few places, no more
        line.join(8, Visitor(f"tab-{i}", "10.0.0.7"))
    with pytest.raises(waiting.QueueFull, match="runs from your network address are already in the line"):
        line.join(8, Visitor("made-up-session", "10.0.0.7"))
    line.join(8, Visitor("a-stranger", "10.0.0.9"))  # others still get in
    assert len(line) == waiting.PER_ADDRESS + 1


def test_one_client_making_up_sessions_cannot_fill_the_page_s_line():
    server = Server()
    line = server.line
    line.join(64)  # a run holds the machine
    runs = [handlers.generate(server, PageValues(instruction="Write a haiku."), Visitor(f"session-{i}", "203.0.113.5"))
            for i in range(waiting.MAX_WAITING_RUNS)]
    firsts = [next(run) for run in runs]
    waiting_runs = [view for view in firsts if view.status.startswith("Waiting for the machine")]
    refused = [view for view in firsts if view.status.startswith("⚠️")]
    assert len(waiting_runs) == waiting.PER_ADDRESS and len(refused) == waiting.MAX_WAITING_RUNS - waiting.PER_ADDRESS
    assert "your network address" in refused[0].status
    stranger = handlers.generate(server, PageValues(instruction="Write a haiku."), Visitor("stranger", "198.51.100.1"))
    assert next(stranger).status.startswith(f"Waiting for the machine: {waiting.PER_ADDRESS + 1} runs ahead of you")
    for run in runs + [stranger]:
        run.close()
    assert len(line) == 1


def test_the_address_is_the_peer_s_unless_a_local_proxy_forwards_for_someone():
    assert address_of("93.184.216.34", None) == "93.184.216.34"
    assert address_of("93.184.216.34", "10.1.1.1") == "93.184.216.34"  # a remote peer cannot claim to forward
    assert address_of("10.0.0.2", "1.2.3.4, 198.51.100.7") == "198.51.100.7"  # the proxy's own entry, not the client's
    assert address_of("127.0.0.1", "") == "127.0.0.1"
    assert address_of("10.0.0.2", "203.0.113.9, 127.0.0.1") == "203.0.113.9"  # this machine is never a visitor's
    assert address_of("127.0.0.1", "127.0.0.1, ::1") == "127.0.0.1"  # nothing else: the first, as the client wrote it


def test_a_forwarded_request_is_never_this_machine_s_whatever_address_it_names():
    line = waiting.RunQueue(max_waiting=32)
    for i in range(waiting.PER_ADDRESS):
        line.join(8, visitor_of(f"claims-{i}", "127.0.0.1", "127.0.0.1"))
    with pytest.raises(waiting.QueueFull, match="your network address"):
        line.join(8, visitor_of("one-more", "10.0.0.2", "127.0.0.1"))


def test_requests_from_this_machine_share_no_address_cap():
    line = waiting.RunQueue(max_waiting=32)
    for i in range(waiting.PER_ADDRESS + 2):
        line.join(8, Visitor(f"local-{i}", "127.0.0.1"))
    assert len(line) == waiting.PER_ADDRESS + 2


def test_an_empty_instruction_is_refused_at_once_not_after_waiting_its_turn():
    server = Server(line=waiting.RunQueue(max_waiting=4))
    line = server.line
    line.join(64)  # a run holds the machine
    views = list(handlers.generate(server, PageValues(instruction=" \n\u3000"), Visitor("visitor", "10.0.0.7")))
    assert [v.status for v in views] == ["⚠️ The instruction is empty."] and len(line) == 1
