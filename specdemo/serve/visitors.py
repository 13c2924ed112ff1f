"""Who presses Generate: a visitor of the page (their browser session and network address), and what belongs to them
alone. No gradio here: page.py reads both from Gradio's request.

The page is public: strangers take turns on one machine. What a visitor's runs leave behind for their next run (the
earlier answers a drafter may draft from: drafters.memories()) is kept per session (Memories, the Server's) and handed
to their runs only; it is forgotten when their tab closes (the page's unload), after IDLE_S without a run, or when more
than MAX_VISITORS sessions are held (the longest idle first).
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
    forwarded: bool = False  # the request named an address in X-Forwarded-For, a header any client can write

    @property
    def on_this_machine(self) -> bool:
        """Whether the request came from this machine itself (its owner's browser, the tests): no address to share a
        cap by. Never for a forwarded request, whatever address it names."""
        return not self.forwarded and _on_this_machine(self.address)


def visitor_of(session: str, peer: str | None, forwarded_for: str | None) -> Visitor:
    """The visitor of a request from `peer` (the address connected to the page) carrying `forwarded_for` (its
    X-Forwarded-For header, or None)."""
    return Visitor(session, address_of(peer, forwarded_for), forwarded=bool(_entries(forwarded_for)))


def address_of(peer: str | None, forwarded_for: str | None) -> str:
    """Where a request comes from: the peer's address; or, when the peer is a proxy (on this machine or a private
    network: a local reverse proxy, a Hugging Face Space's), the address that proxy says it was connected from. Each
    proxy appends that address to X-Forwarded-For, so it is the last entry; entries on this machine are skipped (a
    proxy in front of a proxy here), as uvicorn does for the peers it trusts. What the client wrote comes before, and
    is never read unless every entry is on this machine (then the first: a forwarded request is never this machine's).

    >>> address_of("10.0.0.2", "1.2.3.4, 198.51.100.7")  # a Space: the client wrote 1.2.3.4, its proxy appended
    '198.51.100.7'
    >>> address_of("127.0.0.1", "203.0.113.9, 127.0.0.1")
    '203.0.113.9'
    """
    peer, entries = peer or "", _entries(forwarded_for)
    if not entries or not _is_proxy(peer):
        return peer
    return next((entry for entry in reversed(entries) if not _on_this_machine(entry)), entries[0])


def _entries(forwarded_for: str | None) -> list[str]:
    return [part.strip() for part in (forwarded_for or "").split(",") if part.strip()]


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(text)
    return getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1 is 127.0.0.1


def _on_this_machine(host: str) -> bool:
    try:
        return _address(host).is_loopback
    except ValueError:
        return host in ("", "localhost")  # "": a peer Gradio could not name


# Where a proxy in front of the page sits: this machine, or a private network (RFC 1918, IPv6 unique local). Not
# Python's is_private, which also counts the documentation ranges (203.0.113.0/24, ...) that stand for outside
# addresses in examples and tests.
PROXY_NETWORKS = tuple(ipaddress.ip_network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))


def _is_proxy(host: str) -> bool:
    try:
        return _on_this_machine(host) or any(_address(host) in net for net in PROXY_NETWORKS)
    except ValueError:
        return False


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

