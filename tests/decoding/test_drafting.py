"""Drafting: prompt lookup proposes what followed the latest earlier match of the text's last n-gram; the draft
model's confidence stop ends a round where further drafts would not pay."""

import numpy as np

from specdemo.decoding.drafters.lookup import PromptLookupDrafter, lookup_continuation
from specdemo.settings import GenerationSettings, KPolicy


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


def test_the_hybrid_drafter_drafts_from_the_text_without_a_model_call_where_it_repeats_and_stays_lossless():
    import numpy as np

    from specdemo.decoding import loops
    from specdemo.decoding.drafters.hybrid import HybridDrafter
    from specdemo.decoding.drafters.model import ModelDrafter
    from specdemo.results.lane import drain
    from specdemo.settings import GenerationSettings
    from tests.fake_models import FakeModel, FakeTokenizer

    settings = GenerationSettings(max_new_tokens=60, k_policy=KPolicy.fixed(4))
    target, draft = FakeModel(5, "target", scale=3.0), FakeModel(5, "draft")  # a small vocabulary: the text repeats
    prompt = [0, 1, 2, 0, 1]
    alone = drain(loops.autoregressive(target, FakeTokenizer(), prompt, settings, set())).ids
    hybrid = HybridDrafter(ModelDrafter(draft, settings, np.random.default_rng(0)), PromptLookupDrafter(3),
                           price=lambda name, k: 0.6 * k if name == "prompt-lookup" else 1.0)  # lookup from 2 tokens
    run = drain(loops.speculative(target, hybrid, FakeTokenizer(), prompt, settings, set()))
    assert run.ids == alone  # lossless
    lookup = [r for r in run.rounds if r.drafter == "prompt-lookup"]
    assert lookup and all(r.draft_calls == [] for r in lookup) and sum(r.accepted for r in lookup) > 0
    assert any(r.drafter == "model" and r.draft_calls for r in run.rounds)  # the model drafts where nothing repeats
    assert draft.cache == (prompt + run.ids)[: draft.length]  # behind by the lookup rounds, never wrong


def _softmax_top(row) -> float:
    e = np.exp(row - row.max())
    return float(e.max() / e.sum())


def test_the_confidence_stop_ends_a_round_once_the_drafts_running_confidence_falls_below_it():
    """Greedy: the draft keeps drafting while the product of its top probabilities stays at or above p_min; the draft
    that takes it below is still proposed (its step is paid), the ones after it are not."""
    from specdemo.decoding.drafters.model import ModelDrafter
    from tests.fake_models import FakeModel

    prompt, settings = [0, 1, 2], GenerationSettings(k_policy=KPolicy.fixed(6))
    model = FakeModel(5, "draft", scale=1.5)
    full = ModelDrafter(model, settings, np.random.default_rng(0)).propose(prompt, 6).tokens
    running, prefix = [], tuple(prompt)
    product = 1.0
    for token in full:  # the running confidence after each draft, from the fake's own logits
        product *= _softmax_top(model.logits(prefix))
        running.append(product)
        prefix += (token,)
    for p_min in (0.9, 0.5, 0.2, 0.05):
        model.reset()
        stopped = ModelDrafter(model, settings, np.random.default_rng(0), (p_min,)).propose(prompt, 6)
        expected = next((i + 1 for i, c in enumerate(running) if c < p_min), 6)
        assert stopped.tokens == full[:expected] and len(stopped.calls) == expected, p_min
    assert running[0] < 0.9 and running[-1] < 0.05  # the thresholds above cut at different places


def test_greedy_output_is_unchanged_by_the_confidence_stop():
    from specdemo.decoding import loops
    from specdemo.decoding.drafters.model import ModelDrafter
    from specdemo.results.lane import drain
    from tests.fake_models import FakeModel, FakeTokenizer

    target, draft = FakeModel(3, "target"), FakeModel(3, "draft")
    settings = GenerationSettings(max_new_tokens=60, k_policy=KPolicy.fixed(5))
    plain = drain(loops.autoregressive(target, FakeTokenizer(), [0, 1, 2], settings, set()))
    for p_min in (0.0, 0.3, 0.7):
        run = drain(loops.speculative(target, ModelDrafter(draft, settings, np.random.default_rng(0), (p_min,)),
                                         FakeTokenizer(), [0, 1, 2], settings, set()))
        assert run.ids == plain.ids, p_min
