"""The visible queue: runs take turns on the machine, and whoever waits sees their place and an estimate; Stop while
waiting leaves the queue and the runs behind move up. The queue alone, then the page's handler waiting in it."""

import threading

import pytest

from specdemo.serve import waiting
from specdemo.ui import handlers
from specdemo.serve.server import Server
from specdemo.serve.values import PageValues
from specdemo.serve.visitors import Visitor, address_of, visitor_of
from specdemo.settings import PageSettings


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


def test_a_run_waiting_behind_the_page_s_own_work_is_told_so_not_any_moment():
    """Issue 62: a visitor's run waited ~27 s behind the page's background learning (one token's worth to the pace)
    while the line said "any moment"."""
    server = Server(line=waiting.RunQueue(max_waiting=4))
    server.line.join(1, yields=True, work="learning this machine")  # the page's own turn holds the machine
    views = handlers.generate(server, PageValues(instruction="Write a haiku."), Visitor("visitor", "10.0.0.7"))
    status = next(views).status
    views.close()
    assert "the page is learning this machine and gives the machine up at its next step" in status
    assert "any moment" not in status


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


SPACE = PageSettings(proxies=("10.0.0.0/8",)).proxies  # a Hugging Face Space's proxy, named (README.md)


def test_a_client_that_is_no_named_proxy_is_its_own_address_whatever_it_forwards():
    assert address_of("93.184.216.34", []) == "93.184.216.34"
    assert address_of("127.0.0.1", ["203.0.113.9"]) == "127.0.0.1"  # this machine, or a neighbour on it
    assert address_of("10.0.0.2", ["1.2.3.4, 198.51.100.7"]) == "10.0.0.2"  # a private network is no proxy unnamed


def test_behind_a_named_proxy_the_client_is_the_rightmost_address_that_is_not_a_named_proxy():
    assert address_of("10.0.0.2", ["1.2.3.4, 198.51.100.7"], SPACE) == "198.51.100.7"  # the client wrote 1.2.3.4
    assert address_of("10.0.0.2", ["198.51.100.7, 10.3.3.3"], SPACE) == "198.51.100.7"  # a proxy behind a proxy
    assert address_of("10.0.0.2", [], SPACE) == "10.0.0.2"  # the proxy itself, forwarding for no one
    assert address_of("10.0.0.2", ["[2001:db8::7]:4711, 198.51.100.7:80"], SPACE) == "198.51.100.7"  # ports dropped


def test_every_forwarded_line_is_read_so_a_proxy_that_adds_its_own_line_is_believed():
    """A proxy may add a line of its own rather than append to the client's: the client's spoofed line comes first."""
    assert address_of("10.0.0.2", ["203.0.113.66", "198.51.100.7"], SPACE) == "198.51.100.7"


def test_a_forwarded_entry_that_is_no_address_counts_as_the_proxy_that_passed_it_on():
    assert address_of("10.0.0.2", ["whatever, garbage"], SPACE) == "10.0.0.2"
    assert address_of("10.0.0.2", ["198.51.100.7, junk, 10.9.9.9"], SPACE) == "10.9.9.9"


def test_eight_sessions_from_an_unnamed_client_each_naming_another_address_get_the_per_address_cap():
    line = waiting.RunQueue(max_waiting=32)
    admitted = 0
    for i in range(8):
        try:
            line.join(8, visitor_of(f"session-{i}", "127.0.0.1", [f"203.0.113.{i}"]))
            admitted += 1
        except waiting.QueueFull as full:
            assert "your network address" in str(full)
    assert admitted == waiting.PER_ADDRESS


def test_no_one_address_takes_the_whole_line_not_this_machine_a_named_proxy_nor_one_it_forwards_for():
    for peer, forwarded in (("127.0.0.1", []), ("::1", []), ("10.0.0.2", []), ("10.0.0.2", ["198.51.100.7"])):
        line = waiting.RunQueue(max_waiting=32)
        for i in range(waiting.PER_ADDRESS):
            line.join(8, visitor_of(f"tab-{i}", peer, forwarded, SPACE))
        with pytest.raises(waiting.QueueFull, match="your network address"):
            line.join(8, visitor_of("one-more", peer, forwarded, SPACE))
        line.join(8, visitor_of("a-stranger", "10.0.0.2", ["192.0.2.44"], SPACE))  # others still get in
        assert len(line) == waiting.PER_ADDRESS + 1 < line.max_waiting


def test_an_ipv6_client_counts_as_its_64_network_the_block_one_subscriber_holds():
    line = waiting.RunQueue(max_waiting=32)
    for i in range(waiting.PER_ADDRESS):
        line.join(8, Visitor(f"tab-{i}", f"2001:db8:1:2::{i + 1}"))
    with pytest.raises(waiting.QueueFull, match="your network address"):
        line.join(8, Visitor("one-more", "2001:db8:1:2:ffff::9"))
    line.join(8, Visitor("next-door", "2001:db8:1:3::1"))


def test_an_empty_instruction_is_refused_at_once_not_after_waiting_its_turn():
    server = Server(line=waiting.RunQueue(max_waiting=4))
    line = server.line
    line.join(64)  # a run holds the machine
    views = list(handlers.generate(server, PageValues(instruction=" \n\u3000"), Visitor("visitor", "10.0.0.7")))
    assert [v.status for v in views] == ["⚠️ The instruction is empty."] and len(line) == 1
