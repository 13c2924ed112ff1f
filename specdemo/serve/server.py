"""The Server: everything the page serves from, in one object that app.py makes once per process and hands to every
handler. A test builds the one it needs (fake loaders in its Engines, a line of its own) instead of reaching into a
module."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdemo.serve.engines import Engines
from specdemo.serve.lanes import Runs
from specdemo.serve.visitors import Memories
from specdemo.serve.waiting import MAX_WAITING_RUNS, RunQueue
from specdemo.serve.work import Background
from specdemo.settings import PageSettings


@dataclass
class Server:
    """The state a public page shares between its visitors, each part with its one owner."""

    line: RunQueue = field(default_factory=lambda: RunQueue(MAX_WAITING_RUNS))  # every run's turn on this machine
    engines: Engines = field(default_factory=Engines)  # the engines loaded, shared by every visitor, and their admission
    runs: Runs = field(default_factory=Runs)  # each going run's cancel Event, for the Stop that names it
    background: Background = field(default_factory=Background)  # the machine's background work, held during runs
    memories: Memories = field(default_factory=Memories)  # each visitor's drafters' memories, theirs alone
    settings: PageSettings = field(default_factory=PageSettings)  # the proxies whose X-Forwarded-For is believed
