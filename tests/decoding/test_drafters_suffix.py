"""Suffix decoding (specdemo/decoding/drafters/suffix.py): drafts continue the text's longest suffix where it occurred before,
in this run's text or in its owner's earlier answers (a visitor's, a bench lane's: never anyone else's); the acceptance
rule is untouched, so is the output."""

from specdemo.decoding import loops
from specdemo.decoding.drafters import STRATEGIES, make_drafter, memories
from specdemo.decoding.drafters.suffix import AnswerStore, SuffixDrafter
from specdemo.results.lane import drain
from specdemo.settings import GenerationSettings, KPolicy
from tests.fake_models import FakeModel, FakeTokenizer


def remember(store: AnswerStore, prompt: list[int], answer: list[int]) -> None:
    """One run's drafter calls as the loop makes them, with every token of `answer` the target's own."""
    drafter = SuffixDrafter(store)
    drafter.reset()
    for decided in range(1, len(answer) + 1):
        seq = prompt + answer[:decided]
        drafter.propose(seq, 0)
        drafter.keep(len(seq))


def test_a_fresh_store_and_a_text_that_never_repeats_give_no_drafts():
    drafter = SuffixDrafter(AnswerStore())
    drafter.reset()
    proposal = drafter.propose(list(range(40)), 8)
    assert proposal.tokens == [] and proposal.q is None and proposal.drafter == "suffix"


def test_a_run_repeating_an_earlier_answer_drafts_it_and_its_output_is_unchanged():
    target, prompt = FakeModel(50, "target", scale=3.0), [7, 3, 11, 42, 5]
    settings = GenerationSettings(max_new_tokens=40, k_policy=KPolicy.fixed(4), drafter="suffix")
    alone = drain(loops.autoregressive(target, FakeTokenizer(), prompt, settings, set())).ids
    store = AnswerStore()
    # A new drafter for each run, as the engine makes them: what carries over is the store alone.
    first, second = (drain(loops.speculative(target, SuffixDrafter(store), FakeTokenizer(), prompt, settings, set()))
                     for _ in range(2))
    assert first.ids == alone and second.ids == alone  # lossless, with the store empty and with it full
    rounds = second.rounds[1:]  # after the prefill
    assert sum(r.accepted > 0 for r in rounds) > len(rounds) / 2
    assert {r.drafter for r in rounds if r.drafted} == {"suffix"}
    assert len(second.rounds) < len(first.rounds)


def test_the_longest_match_wins_over_shorter_more_frequent_ones():
    store = AnswerStore()
    remember(store, [90], [7, 8, 9, 1])
    for _ in range(3):
        remember(store, [91], [6, 8, 9, 2])
    drafter = SuffixDrafter(store)
    drafter.reset()
    assert drafter.propose([50, 51, 7, 8, 9], 4).tokens == [1]  # "7 8 9" occurred once, "8 9 2" three times


def test_the_most_frequent_continuation_wins_among_equally_long_matches():
    store = AnswerStore()
    for answer in ([3, 4, 7, 8], [3, 4, 7, 8], [3, 4, 5, 6]):  # the least frequent is the newest
        remember(store, [90], answer)
    drafter = SuffixDrafter(store)
    drafter.reset()
    assert drafter.propose([50, 51, 3, 4], 4).tokens == [7, 8]


def test_nothing_is_drafted_where_earlier_answers_disagree():
    store = AnswerStore()
    for follower in (10, 11, 12):
        remember(store, [90], [3, 4, follower])
    drafter = SuffixDrafter(store)
    drafter.reset()
    assert drafter.propose([50, 51, 3, 4], 4).tokens == []  # each continuation has a third of the matches


def test_only_confirmed_tokens_are_stored():
    store = AnswerStore()
    drafter = SuffixDrafter(store)
    drafter.reset()
    seq = [1, 2, 3, 1, 2]
    assert drafter.propose(seq, 3).tokens == [3, 1, 2]  # from the text itself
    drafter.keep(len(seq) + 1)  # the target accepted 3 and rejected the rest
    after_3, after_1_2 = SuffixDrafter(store), SuffixDrafter(store)
    after_3.reset()
    after_1_2.reset()
    assert after_3.propose([8, 9, 2, 3], 4).tokens == []  # the rejected "1 2" never reached the store
    assert after_1_2.propose([8, 9, 1, 2], 4).tokens == [3]


def test_the_store_keeps_its_bounds_by_dropping_the_oldest_answers():
    by_count = AnswerStore(max_answers=2, max_tokens=1000)
    by_tokens = AnswerStore(max_answers=10, max_tokens=12)  # an answer of 5 tokens is held as 6 (one before it)
    for store in (by_count, by_tokens):
        for first in (20, 30, 40):
            remember(store, [90], [first, first + 1, first + 2, first + 3, first + 4])
        assert len(store) == 2 and store.tokens <= store.max_tokens
        drafter = SuffixDrafter(store)  # its own answer, opened at its first proposal, drops the next oldest
        drafter.reset()
        assert drafter.propose([50, 51, 20, 21], 2).tokens == []  # the oldest answer is gone
        assert drafter.propose([50, 51, 20, 21, 40, 41], 2).tokens == [42, 43]  # the newest is held


def test_the_registry_finds_the_suffix_strategy_and_the_settings_accept_it():
    suffix = STRATEGIES["suffix"]
    assert (suffix.label, suffix.needs_model, suffix.planning.prior) == ("your earlier answers (suffix match)", False, "suffix")
    assert "no one else's answers" in suffix.planning.note  # the page says what it draws on
    settings = GenerationSettings(drafter="suffix")
    assert make_drafter(STRATEGIES[settings.drafter], None, settings, None).kind == "suffix"


def test_each_owner_of_runs_has_a_store_of_its_own_and_a_run_without_one_remembers_only_itself():
    settings = GenerationSettings(drafter="suffix")
    mine, theirs = memories(), memories()
    assert set(mine) == {"suffix"} and mine["suffix"] is not theirs["suffix"]
    first, again = (make_drafter(STRATEGIES["suffix"], None, settings, None, memories=mine) for _ in range(2))
    assert first.store is again.store is mine["suffix"]  # one visitor's runs share their store
    assert make_drafter(STRATEGIES["suffix"], None, settings, None, memories=theirs).store is theirs["suffix"]
    alone, other = (make_drafter(STRATEGIES["suffix"], None, settings, None) for _ in range(2))
    assert alone.store is not other.store and alone.store is not mine["suffix"]  # no owner: a store of its own


def test_an_answer_written_for_one_owner_is_never_drafted_for_another():
    prompt, answer = [7, 3, 11, 42, 5], [60, 61, 62, 63, 64, 65, 66, 67]
    mine, theirs = memories(), memories()
    remember(mine["suffix"], prompt, answer)
    settings = GenerationSettings(drafter="suffix")
    asked = prompt + answer[:2]
    for owner, expected in ((mine, answer[2:6]), (theirs, [])):
        drafter = make_drafter(STRATEGIES["suffix"], None, settings, None, memories=owner)
        drafter.reset()
        assert drafter.propose(asked, 4).tokens == expected
