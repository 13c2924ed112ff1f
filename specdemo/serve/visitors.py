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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specdemo.decoding import drafters

IDLE_S = 3600.0  # a session that ran nothing for this long is forgotten
MAX_VISITORS = 512  # sessions whose memories are held at once; each store is bounded by its strategy
Network = ipaddress.IPv4Network | ipaddress.IPv6Network  # a proxy the operator names (PageSettings.proxies)


@dataclass(frozen=True)
class Visitor:
    """One visitor: their browser tab's session (Gradio's session hash) and the address their requests come from."""

    session: str
    address: str = ""

    @property
    def counted_as(self) -> str:
        """What the line's cap per address counts this visitor as: their address, or for IPv6 its /64, the block one
        subscriber is given (its 2^64 addresses are one client's to pick from)."""
        try:
            address = _address(self.address)
        except ValueError:
            return self.address
        return str(ipaddress.ip_network(f"{address}/64", strict=False)) if address.version == 6 else str(address)


def visitor_of(session: str, peer: str | None, forwarded_for: Iterable[str], proxies: Sequence[Network] = ()) -> Visitor:
    """The visitor of a request from `peer` (the address connected to the page) carrying `forwarded_for` (every
    X-Forwarded-For line it has), when the page's reverse proxies are `proxies` (PageSettings.proxies)."""
    return Visitor(session, address_of(peer, forwarded_for, proxies))


def address_of(peer: str | None, forwarded_for: Iterable[str], proxies: Sequence[Network] = ()) -> str:
    """Where a request comes from: the peer's address, unless the peer is one of `proxies`. A proxy appends the address
    it was connected from to X-Forwarded-For (or adds a line of its own: every line is read, in order), so from the
    right, the entries are the named proxies that passed the request on, then the client: the first entry that is no
    named proxy. What the client wrote comes before it and is never read. An entry that is no address was passed on
    by the proxy to its right, which then answers for it.

    >>> space = [ipaddress.ip_network("10.0.0.0/8")]
    >>> address_of("10.0.0.2", ["1.2.3.4, 198.51.100.7"], space)  # the client wrote 1.2.3.4, the Space's proxy appended
    '198.51.100.7'
    >>> address_of("127.0.0.1", ["203.0.113.9"])  # no named proxy: the peer, whatever it wrote
    '127.0.0.1'
    """
    hop = peer or ""
    if not _is_proxy(hop, proxies):
        return hop
    for entry in reversed([part.strip() for line in forwarded_for for part in (line or "").split(",") if part.strip()]):
        try:
            address = _address(_host(entry))
        except ValueError:
            return hop
        if not _is_proxy(str(address), proxies):
            return str(address)
        hop = str(address)
    return hop


def _host(entry: str) -> str:
    """An entry without its port: "[2001:db8::7]:4711" or "198.51.100.7:80" as the address alone."""
    if entry.startswith("[") and "]" in entry:
        return entry[1:entry.index("]")]
    return entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(text)
    return getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1 is 127.0.0.1


def _is_proxy(host: str, proxies: Sequence[Network]) -> bool:
    try:
        address = _address(host)
    except ValueError:
        return False
    return any(address in net for net in proxies)


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

