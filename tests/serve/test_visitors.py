"""Strangers share the page: what one visitor's runs leave behind (the earlier answers a drafter draws on) reaches
their own next run and no one else's: not its drafts, its page, its failures panel or its download."""

import pytest

from specdemo.settings import GenerationSettings, KPolicy, RunSettings
from specdemo.ui import handlers
from specdemo.serve.values import PageValues
from specdemo.serve.visitors import Memories, Visitor
from tests.conftest import downloaded_run, exact, serve_on_the_page

INSTRUCTION = "w5 w17 w99 w3 w250 w42 w7"


@pytest.fixture(scope="module")
def settings(tiny_target, tiny_draft) -> RunSettings:
    return RunSettings(exact(tiny_target), exact(tiny_draft),
                       GenerationSettings(max_new_tokens=24, k_policy=KPolicy.fixed(4), drafter="suffix"))


@pytest.fixture
def page(settings):
    """handlers.generate on the tiny pair, on a server of its own (a fresh set of visitors' memories); press(visitor) ->
    the run's record."""
    server = serve_on_the_page(settings)
    values = PageValues(instruction=INSTRUCTION, max_new_tokens=24, k=4, k_auto=False, drafter="suffix")

    def press(visitor: Visitor) -> dict:
        views = list(handlers.generate(server, values, visitor))
        return downloaded_run(views[-1].download)
    return press


def drafts(record: dict) -> list[tuple[int, int]]:
    """(drafted, accepted) of each round of the speculative lane."""
    return [(r["drafted"], r["accepted"]) for r in record["speculative"]["rounds"]]


def test_a_visitor_drafts_from_their_own_earlier_answer_and_never_from_another_visitors(page):
    first = page(Visitor("alice", "10.0.0.1"))
    again = page(Visitor("alice", "10.0.0.1"))
    # Alice's second run finds her first answer in her store: it drafts (nearly) the whole answer from it.
    assert sum(a for _, a in drafts(again)) > sum(a for _, a in drafts(first))
    assert again["speculative"]["token_ids"] == first["speculative"]["token_ids"]  # lossless either way

    # Bob asks the very same thing after her: his run drafts only from his own text, as Alice's first run did, so
    # every round of it (what was drafted, what was struck through) is the one a first visitor gets.
    bob = page(Visitor("bob", "10.0.0.2"))
    assert drafts(bob) == drafts(first)
    assert bob["failures"] == first["failures"]


def test_a_visitor_who_left_is_forgotten_and_comes_back_to_an_empty_store():
    memories = Memories()
    alice = Visitor("alice")
    store = memories.of(alice)
    assert memories.of(alice) is store
    memories.forget("alice")
    assert memories.of(alice) is not store and len(memories) == 1


def test_sessions_idle_too_long_or_beyond_the_cap_are_forgotten_first():
    now = [0.0]
    memories = Memories(idle_s=60, max_visitors=2, clock=lambda: now[0])
    a = memories.of(Visitor("a"))
    memories.of(Visitor("b"))
    now[0] = 30
    memories.of(Visitor("a"))  # a ran again: b is now the longest idle
    memories.of(Visitor("c"))
    assert len(memories) == 2 and memories.of(Visitor("a")) is a  # b went first
    now[0] = 200
    memories.of(Visitor("d"))
    assert len(memories) == 1  # a and c sat idle past the hour's stand-in
