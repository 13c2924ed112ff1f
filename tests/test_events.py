"""Events: incremental text, draining a loop, and Leviathan's expected speedup."""

import threading

import pytest

from specdemo.events import TARGET, Detokenizer, Summary, TokenEvent, drain, expected_speedup


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


def test_expected_speedup_matches_leviathan_equation_one():
    # alpha = 0.8, K = 4, c = 0.1: (1 - 0.8^5) / (0.2 * 1.4) = 2.3834...
    assert expected_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))


def test_expected_speedup_with_every_draft_accepted():
    assert expected_speedup(1.0, 4, 0.25) == pytest.approx(5 / 2)


def test_expected_speedup_with_nothing_accepted_is_a_slowdown():
    assert expected_speedup(0.0, 4, 0.2) == pytest.approx(1 / 1.8)


def test_drain_collects_tokens_until_the_summary_and_closes_the_loop():
    lock = threading.Lock()

    def loop():  # like an engine: the summary is yielded while the lock is still held
        with lock:
            yield TokenEvent(5, "a", TARGET, 0, 0.1)
            yield TokenEvent(6, "b", TARGET, 1, 0.2)
            yield Summary(mode="autoregressive", tokens=2)

    events = loop()
    seen = []
    result = drain(events, on_token=seen.append)
    assert result.ids == [5, 6] and result.text == "ab" and result.summary.tokens == 2 and seen == result.tokens
    assert lock.acquire(blocking=False)  # released although `events` is still referenced here


def test_drain_refuses_a_loop_that_ends_without_a_summary():
    with pytest.raises(RuntimeError, match="without a summary"):
        drain(iter([TokenEvent(5, "a", TARGET, 0, 0.1)]))
