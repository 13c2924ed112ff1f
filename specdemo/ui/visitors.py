"""Who presses Generate: a visitor of the page (their browser session and network address), and what belongs to them
alone. No gradio here: page.py reads both from Gradio's request.

The page is public: strangers take turns on one machine. What a visitor's runs leave behind for their next run (the
earlier answers a drafter may draft from: drafters.memories()) is kept per session, here, and handed to their runs
only; it is forgotten when their tab closes (the page's unload), after IDLE_S without a run, or when more than
MAX_VISITORS sessions are held (the longest idle first).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from specdemo.decoding import drafters

IDLE_S = 3600.0  # a session that ran nothing for this long is forgotten
MAX_VISITORS = 512  # sessions whose memories are held at once; each store is bounded by its strategy


@dataclass(frozen=True)
class Visitor:
    """One visitor: their browser tab's session (Gradio's session hash) and the address their requests come from."""

    session: str
    address: str = ""

    @property
    def on_this_machine(self) -> bool:
        """Whether the request came from this machine itself (its owner's browser, the tests, a proxy that forwarded
        no address): no address to share a cap by."""
        try:
            return ipaddress.ip_address(self.address).is_loopback
        except ValueError:
            return self.address in ("", "localhost")


def address_of(client_host: str | None, forwarded_for: str | None) -> str:
    """Where a request comes from: the peer's address, or, when the peer is a proxy on this machine or a private
    network (a Hugging Face Space's, a reverse proxy's), the last address it says it forwarded for. Only the last one:
    the ones before it are whatever the client wrote."""
    host = client_host or ""
    forwarded = [part.strip() for part in (forwarded_for or "").split(",") if part.strip()]
    if forwarded and _is_local(host):
        return forwarded[-1]
    return host


def _is_local(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host in ("", "localhost")
    return address.is_loopback or address.is_private


class Memories:
    """Each session's drafter memories (drafters.memories()), made at its first run, dropped when it leaves."""

    def __init__(self, idle_s: float = IDLE_S, max_visitors: int = MAX_VISITORS, clock=time.monotonic):
        self.idle_s, self.max_visitors, self.clock = idle_s, max_visitors, clock
        self._held: OrderedDict[str, tuple[float, dict[str, object]]] = OrderedDict()  # by session, least recent first
        self._lock = threading.Lock()

    def of(self, visitor: Visitor) -> dict[str, object]:
        """This visitor's memories (new and empty on their first run, or after they were forgotten)."""
        now = self.clock()
        with self._lock:
            self._forget_idle(now)
            _, held = self._held.pop(visitor.session, (now, None))
            held = held if held is not None else drafters.memories()
            self._held[visitor.session] = (now, held)
            while len(self._held) > self.max_visitors:
                self._held.popitem(last=False)
            return held

    def forget(self, session: str) -> None:
        """The visitor left (their tab closed): nothing of theirs is kept."""
        with self._lock:
            self._held.pop(session, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def _forget_idle(self, now: float) -> None:
        while self._held:
            session, (last, _) = next(iter(self._held.items()))
            if now - last < self.idle_s:
                return
            del self._held[session]


MEMORIES = Memories()  # the page's visitors', one per session
