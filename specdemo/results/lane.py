"""One lane's stream, consumed: the plan, token events and rounds a decoding loop yields (specdemo/decoding/events.py),
collected until its end into a Result whose summary specdemo/results/metrics.py derives. The one consumer of a loop's stream:
the CLI, the page and the benchmark all read lanes through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from specdemo.decoding.events import End, Round, TokenEvent
from specdemo.decoding.planner import Plan
from specdemo.results.metrics import Summary, summarize


@dataclass
class Result:
    """One lane, drained: its tokens, rounds and summary, and the plan it ran under (speculative, with a planner)."""

    tokens: list[TokenEvent]
    summary: "Summary"
    rounds: list[Round] = field(default_factory=list)
    plan: Plan | None = None  # yielded by the engine before a speculative lane's first token

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)


def finished(lane: "Result | LaneLog | None") -> bool:
    """The one answer to "did the lane finish?": it ended by itself, at an EOS or its budget; not by an error (no
    summary, or no lane at all) nor by Stop (a loop's End says "cancelled")."""
    return lane is not None and lane.summary is not None and lane.summary.stop_reason != "cancelled"


class LaneLog:
    """What one lane has yielded so far, and its summary once it ends: the one consumer of a loop's stream,
    used by `drain` and by the page. A loop ends with an End (the summary is then derived from its records
    by metrics.summarize) or, for a peer that keeps its own figures (GenAI), with a ready Summary."""

    def __init__(self):
        self.events: list[TokenEvent] = []
        self.rounds: list[Round] = []
        self.plan = None
        self.end: End | None = None
        self.summary: Summary | None = None

    def take(self, event) -> None:
        if isinstance(event, TokenEvent):
            self.events.append(event)
        elif isinstance(event, Round):
            self.rounds.append(event)
        elif isinstance(event, End):
            self.end = event
            # the prediction is priced on the plan the lane ran under (yielded first), not on anything the loop carries
            self.summary = summarize(self.events, self.rounds, event, self.plan.costs if self.plan is not None else None)
        elif isinstance(event, Summary):
            self.summary = event
        elif isinstance(event, Plan):
            self.plan = event
        else:
            raise TypeError(f"a decoding loop yielded {type(event).__name__}, which no consumer knows")

    def result(self) -> Result:
        return Result(self.events, self.summary, self.rounds, self.plan)


def drain(events: Iterable, on_event: Callable[[object], None] | None = None) -> Result:
    """The one way to consume a decoding loop: collect its plan, tokens and rounds (calling `on_event` with each as
    it comes) until it ends. A loop that ends without an End or a Summary is a bug in the loop."""
    log = LaneLog()
    try:
        for event in events:
            log.take(event)
            if log.summary is not None:
                return log.result()
            if on_event is not None:
                on_event(event)
    finally:
        # An engine yields its end while holding its lock; closing the generator now releases it,
        # whoever keeps a reference to the generator (a caller's frame, a traceback) and for however long.
        close = getattr(events, "close", None)
        if close is not None:
            close()
    raise RuntimeError("the decoding loop ended without a summary")
