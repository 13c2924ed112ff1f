"""Events: incremental text, and draining a loop (its plan, tokens and rounds, then the summary metrics.py derives)."""

import threading

import pytest

from specdemo.decoding.drafters import STRATEGIES
from specdemo.decoding.events import TARGET, Detokenizer, End, Round, TokenEvent
from specdemo.decoding.planner import Plan
from specdemo.decoding.pricing import Acceptance
from specdemo.results.lane import drain
from specdemo.results.metrics import Summary
from specdemo.settings import KPolicy


class ByteTokenizer:
    """Each token is one UTF-8 byte: the harshest case for incremental decoding."""

    def decode(self, ids, **kwargs):
        return bytes(ids).decode("utf-8", errors="replace")


def test_detokenizer_never_splits_a_multibyte_character():
    text = "añ🙂b你"
    detok = Detokenizer(ByteTokenizer())
    pieces = [detok.add(b) for b in text.encode()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert pieces[:2] == ["a", ""]  # the first byte of ñ waits for the second


def test_drain_collects_tokens_until_the_summary_and_closes_the_loop():
    lock = threading.Lock()

    def loop():  # like an engine: the summary is yielded while the lock is still held
        with lock:
            yield TokenEvent(5, "a", TARGET, 0, 0.1)
            yield TokenEvent(6, "b", TARGET, 1, 0.2)
            yield Summary(mode="autoregressive", tokens=2)  # a peer (GenAI) ends with its own summary

    events = loop()
    seen = []
    result = drain(events, on_event=seen.append)
    assert result.ids == [5, 6] and result.text == "ab" and result.summary.tokens == 2 and seen == result.tokens
    assert lock.acquire(blocking=False)  # released although `events` is still referenced here


def test_drain_refuses_a_loop_that_ends_without_a_summary():
    with pytest.raises(RuntimeError, match="without a summary"):
        drain(iter([TokenEvent(5, "a", TARGET, 0, 0.1)]))


def test_drain_derives_the_summary_from_the_records_and_keeps_the_plan_beside_it():
    plan = Plan(KPolicy.auto(), STRATEGIES["model"], 2, None, Acceptance.geometric(0.8), 1.5, "K = 2 chosen")

    def loop():
        yield plan
        yield TokenEvent(5, "a", TARGET, 0, 0.1)
        yield Round(0, 0, 0, "", [], 0.0, 12, 0.05, 0, 0, 1, 0.0, 0.1)
        for i, token in enumerate((6, 7, 8)):
            yield TokenEvent(token, "x", "accepted" if i < 2 else "bonus", 1, 0.2)
        yield Round(1, 12, 2, "model", [(13, 0.02), (1, 0.01)], 0.03, 3, 0.06, 2, 2, 3, 0.001, 0.2)
        yield End("speculative", "max_new_tokens", 0.25, 12, k_max=2, drafter="model")

    seen = []
    result = drain(loop(), on_event=seen.append)
    assert result.plan is plan and seen[0] is plan  # the plan travels beside the result, not inside its summary
    assert result.ids == [5, 6, 7, 8] and len(result.rounds) == 2
    assert result.summary.tokens == 4 and result.summary.accepted == 2 and result.summary.mean_acceptance_length == 3.0


def test_a_lane_finished_when_it_ended_by_itself_not_by_stop_or_an_error():
    from specdemo.results.lane import LaneLog, finished
    from specdemo.results.metrics import Summary

    def lane(summary):
        log = LaneLog()
        log.summary = summary
        return log

    assert finished(lane(Summary("speculative", stop_reason="eos")))
    assert finished(lane(Summary("speculative", stop_reason="max_new_tokens")).result())
    assert not finished(lane(Summary("speculative", stop_reason="cancelled")))  # Stop
    assert not finished(lane(None)) and not finished(None)  # an error: no summary, or no lane at all
