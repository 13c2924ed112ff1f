"""A visible queue: runs take turns on the shared machine, first come first served, and whoever waits sees their
place and an estimate ("3 runs ahead of you, about 40 s").

One run at a time is what makes the figures honest: two runs at once would share the cores and slow each other.
The page's Generate handler joins the line, waits its turn yielding its place, and leaves when done; Stop while
waiting leaves the line at once, and the runs behind move up. Estimates come from how long recent runs took per
requested token. The line is fair: one visitor holds at most PER_SESSION places, and one address at most PER_ADDRESS
(a classroom behind one router shares an address; a client making up new sessions does not get more places), whatever
the address: this machine's, a proxy's, or one a named proxy forwards for (visitors.address_of); an IPv6 client counts
as its /64 (Visitor.counted_as). The line as a whole holds MAX_WAITING_RUNS, so no one address comes near filling it.

The Server's `line` is this process's one line: the visitors' runs (turn.py) and the server's own turns,
learning the machine and applying a tune (learning.py), join it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterator

from specdemo.serve.visitors import Visitor

DEFAULT_SECONDS_PER_TOKEN = 0.12  # before any run finished: both lanes of a 2-core machine, roughly
POLL_S = 0.25  # how often a waiting visitor's place is re-read
PER_SESSION = 1  # places one browser session may hold (its run, running or waiting)
PER_ADDRESS = 3  # places the sessions of one network address may hold together
MAX_WAITING_RUNS = 32  # runs that may wait for the machine; one more is refused with a sentence


class QueueFull(ValueError):
    """More runs are waiting than the page accepts."""


@dataclass(eq=False)
class Ticket:
    """One run's place in the line."""

    tokens: int  # new tokens it asked for (what its run will take scales with them)
    visitor: Visitor | None = None  # whose run it is (None: the server's own turn, such as applying a tune)
    yields: bool = False  # the server's own work that lets visitors go first (learning the machine: RunQueue.join)
    started: float | None = None  # when its turn came
    work: str = ""  # the server's own turn: what it does, told to the visitors behind it ("learning this machine")


class RunQueue:
    """The line of runs for one machine. The first ticket is the run in progress."""

    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        self._line: list[Ticket] = []
        self._changed = threading.Condition()
        self._seconds_per_token: deque[float] = deque(maxlen=8)  # of recent runs

    def join(self, tokens: int, visitor: Visitor | None = None, yields: bool = False, work: str = "") -> Ticket:
        """A place at the end of the line (a visitor's goes ahead of the server's `yields` work that has not started),
        or QueueFull with a sentence (the line is full, or this visitor holds as many places as a visitor may)."""
        with self._changed:
            if len(self._line) > self.max_waiting:
                raise QueueFull(f"{len(self._line) - 1} runs are already waiting, the most this page takes; "
                                "try again in a minute")
            if visitor is not None:
                self._check_share(visitor)
            ticket = Ticket(max(tokens, 1), visitor, yields, work=work)
            later = [i for i, t in enumerate(self._line) if t.yields and t.started is None and i > 0]
            self._line.insert(later[0] if visitor is not None and later else len(self._line), ticket)
            self._changed.notify_all()
            if len(self._line) == 1:
                ticket.started = time.perf_counter()
            return ticket

    def _check_share(self, visitor: Visitor) -> None:
        theirs = [t.visitor for t in self._line if t.visitor is not None]
        if sum(v.session == visitor.session for v in theirs) >= PER_SESSION:
            raise QueueFull("your previous run is still running or waiting; press Stop or wait for it to end first")
        if sum(v.counted_as == visitor.counted_as for v in theirs) >= PER_ADDRESS:
            raise QueueFull(f"{PER_ADDRESS} runs from your network address are already in the line, the most this page "
                            "takes from one address; try again when one has ended")

    def visitors_behind(self, ticket: Ticket) -> bool:
        """Whether a visitor's run waits behind `ticket` (the server's yielding work then stops for it)."""
        with self._changed:
            return any(t.visitor is not None for t in self._line[self._line.index(ticket) + 1:]) \
                if ticket in self._line else False

    def page_work_ahead(self, ticket: Ticket) -> str:
        """What the server's own turn holding the machine ahead of `ticket` does, as a clause for its status line ("the
        page is learning this machine and gives the machine up at its next step"); "" when a visitor's run holds it.
        The pace cannot say how long such a turn takes: it asked for no tokens."""
        with self._changed:
            head = self._line[0] if self._line and ticket in self._line[1:] else None
        if head is None or head.visitor is not None or not head.work:
            return ""
        return f"the page is {head.work} " + ("and gives the machine up at its next step" if head.yields else "first")

    def ahead(self, ticket: Ticket) -> int:
        """How many runs are before this one (0: its turn)."""
        with self._changed:
            return self._line.index(ticket) if ticket in self._line else 0

    def estimate_s(self, ticket: Ticket) -> float:
        """Seconds until this ticket's turn: what the runs ahead asked for at the recent pace, less what the
        running one has already done."""
        pace = statistics.median(self._seconds_per_token) if self._seconds_per_token else DEFAULT_SECONDS_PER_TOKEN
        with self._changed:
            ahead = self._line[: self._line.index(ticket)] if ticket in self._line else []
            seconds = sum(t.tokens * pace for t in ahead)
            if ahead and ahead[0].started is not None:
                seconds -= min(time.perf_counter() - ahead[0].started, ahead[0].tokens * pace)
        return max(seconds, 0.0)

    def wait(self, ticket: Ticket, cancel: threading.Event) -> Iterator[tuple[int, float]]:
        """Until this ticket's turn, yield (runs ahead, seconds estimated) now and whenever the line moves or every
        POLL_S; returns at its turn. If `cancel` is set while waiting, the ticket leaves the line and this returns."""
        last = None
        while True:
            with self._changed:
                if cancel.is_set():
                    self._remove(ticket)
                    return
                if self._line and self._line[0] is ticket:
                    return
            place = (self.ahead(ticket), self.estimate_s(ticket))
            yield place
            if place[0] == last:
                with self._changed:
                    self._changed.wait(POLL_S)
            last = place[0]

    def leave(self, ticket: Ticket, finished: bool = True) -> None:
        """This run is done (or gave up): the next one's turn. A finished run teaches the pace."""
        with self._changed:
            if finished and ticket.started is not None and self._line and self._line[0] is ticket:
                self._seconds_per_token.append((time.perf_counter() - ticket.started) / ticket.tokens)
            self._remove(ticket)

    def _remove(self, ticket: Ticket) -> None:
        if ticket in self._line:
            self._line.remove(ticket)
            if self._line and self._line[0].started is None:
                self._line[0].started = time.perf_counter()
            self._changed.notify_all()

    def __len__(self) -> int:
        with self._changed:
            return len(self._line)



def describe_place(ahead: int, seconds: float, page_work: str = "") -> str:
    """The waiting visitor's status line; `page_work`: what the server's own turn ahead does (RunQueue.page_work_ahead),
    said instead of a time."""
    runs = "1 run" if ahead == 1 else f"{ahead} runs"
    when = page_work or (f"about {seconds:.0f} s" if seconds >= 1.5 else "any moment")
    return f"Waiting for the machine: {runs} ahead of you, {when}. Runs take turns so each has the whole machine; Stop leaves the queue."
