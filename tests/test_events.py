"""Events: incremental text, and Leviathan's expected speedup."""

import pytest

from specdemo.events import Detokenizer, expected_speedup


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
