"""Prompt lookup: propose what followed the latest earlier match of the text's last n-gram."""

from specdemo.drafting import PromptLookupDrafter, lookup_continuation


def test_lookup_proposes_what_followed_the_last_ngram():
    seq = [1, 2, 3, 4, 5, 6, 9, 2, 3]
    assert lookup_continuation(seq, k=3, max_ngram=2) == [4, 5, 6]


def test_lookup_prefers_the_most_recent_match():
    seq = [7, 1, 2, 8, 1, 2, 9, 1, 2]
    assert lookup_continuation(seq, k=1, max_ngram=2) == [9]


def test_lookup_prefers_longer_ngrams():
    # "3" alone last followed by 8, but the 2-gram "2 3" matches earlier and is followed by 4.
    seq = [2, 3, 4, 0, 3, 8, 2, 3]
    assert lookup_continuation(seq, k=1, max_ngram=2) == [4]


def test_lookup_proposes_nothing_without_a_match():
    assert lookup_continuation([1, 2, 3, 4], k=4, max_ngram=3) == []


def test_lookup_stops_at_the_end_of_the_text():
    seq = [5, 6, 7, 5, 6]
    assert lookup_continuation(seq, k=5, max_ngram=2) == [7, 5, 6]


def test_prompt_lookup_drafter_times_its_lookup_calls_no_model_and_has_no_cache_to_roll_back():
    drafter = PromptLookupDrafter(max_ngram=2)
    proposal = drafter.propose([1, 2, 3, 1, 2], 2)
    drafter.keep(3)
    assert proposal.tokens == [3, 1] and proposal.q is None
    assert proposal.calls == [] and proposal.seconds > 0
