"""Speculative sampling, end to end: the real loop and the real draft-model drafter on fake models whose
distributions depend on the whole prefix, so every slot of a round has its own p and q.

The first tokens of many seeded runs must follow the target's own distribution, computed exactly from
the fake target's logits with the same temperature / top-k / top-p processing. Unlike the rule's unit
tests in test_verification.py (one p and one q for every position), this fails if the loop or the rule
checks a draft against another slot's row, rolls a cache back to the wrong length, or feeds the wrong
tokens.
"""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import chisquare

from specdemo.decoding import loops
from specdemo.decoding.drafters import Proposal
from specdemo.decoding.drafters.hybrid import HybridDrafter
from specdemo.decoding.drafters.lookup import PromptLookupDrafter
from specdemo.decoding.drafters.model import ModelDrafter
from specdemo.decoding.verification import process_logits
from specdemo.results.lane import drain
from specdemo.settings import GenerationSettings, KPolicy
from tests.fake_models import FakeModel, FakeTokenizer

PROMPT = [0, 2, 1]
TOKENS = 4  # the prefill's token, then a round of 2 drafts and the bonus: every row of a round is used

CASES = {  # vocabulary size, settings, runs (a run takes about 0.6 ms, 1.1 ms with top-p)
    "temperature": (3, GenerationSettings(max_new_tokens=TOKENS, k_policy=KPolicy.fixed(2), temperature=1.0), 8_000),
    "top-k and top-p": (4, GenerationSettings(max_new_tokens=TOKENS, k_policy=KPolicy.fixed(2), temperature=0.7, top_k=3, top_p=0.9), 6_000),
}


def target_probability(target: FakeModel, settings: GenerationSettings, tokens: tuple[int, ...]) -> float:
    """The probability that the target alone, sampling with `settings`, starts its answer with `tokens`."""
    probability, prefix = 1.0, tuple(PROMPT)
    for token in tokens:
        probability *= process_logits(target.logits(prefix)[None, :], settings)[0, token]
        prefix += (token,)
    return probability


def speculative_runs(target: FakeModel, draft: FakeModel, settings: GenerationSettings, runs: int, seed: int,
                     hybrid: bool = False, p_min: float = 0.0, gate: float = 0.0):
    """The token ids of `runs` speculative runs, drafts and verification sharing one seeded generator as the engine's do.
    `hybrid`: the hybrid drafter, taking every lookup proposal of two tokens or more (the draft model elsewhere);
    `p_min`: the draft model's confidence stop; `gate`: gated rounds."""
    rng = np.random.default_rng(seed)
    drafter = ModelDrafter(draft, settings, rng, (p_min,) if p_min else (), gate)
    if hybrid:
        drafter = HybridDrafter(drafter, PromptLookupDrafter(2), price=lambda name, k: 0.6 * k if name == "prompt-lookup" else 1.0)
    for _ in range(runs):
        yield drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set(), rng=rng))


def pooled_chisquare(observed: dict, expected: dict) -> float:
    """χ² p-value of observed counts against expected ones; cells expecting fewer than 5 are pooled into one."""
    small = [cell for cell, e in expected.items() if e < 5]
    big = [cell for cell in expected if cell not in small]
    f_obs = [observed.get(cell, 0) for cell in big]
    f_exp = [expected[cell] for cell in big]
    if small:
        f_obs.append(sum(observed.get(cell, 0) for cell in small))
        f_exp.append(sum(expected[cell] for cell in small))
    return chisquare(f_obs, f_exp).pvalue


@pytest.mark.parametrize("case", CASES)
def test_the_first_tokens_of_speculative_sampling_follow_the_targets_distribution(case):
    vocab, settings, runs = CASES[case]
    target, draft = FakeModel(vocab, "target"), FakeModel(vocab, "draft")
    observed: dict[tuple[int, ...], int] = {}
    rejected = bonus = 0  # runs whose first round rejected a draft, or kept both and drew the bonus
    for run in speculative_runs(target, draft, settings, runs, seed=2024):
        observed[tuple(run.ids)] = observed.get(tuple(run.ids), 0) + 1
        sources = [t.source for t in run.tokens[1:]]
        rejected += "corrected" in sources[:2]
        bonus += sources == ["accepted", "accepted", "bonus"]
    exact = {cell: runs * target_probability(target, settings, cell) for cell in itertools.product(range(vocab), repeat=TOKENS)}
    assert sum(exact.values()) == pytest.approx(runs)
    assert not [cell for cell in observed if exact[cell] == 0], "a sequence the target can never produce was emitted"
    # Both branches of the rule run often: rejections in the first round's slots, and its bonus slot.
    assert bonus > 0.2 * runs and rejected > 0.2 * runs
    assert pooled_chisquare(observed, {cell: e for cell, e in exact.items() if e > 0}) > 0.001


def test_the_hybrid_drafter_follows_the_targets_distribution_too():
    """Rounds drafted by lookup (deterministic: q one-hot) and by the model (q sampled) mix in one run."""
    vocab, settings, runs = CASES["temperature"]
    target, draft = FakeModel(vocab, "target"), FakeModel(vocab, "draft")
    observed, kinds = {}, {"model": 0, "prompt-lookup": 0}
    for run in speculative_runs(target, draft, replace(settings, k_policy=KPolicy.fixed(2)), runs, seed=11, hybrid=True):
        observed[tuple(run.ids)] = observed.get(tuple(run.ids), 0) + 1
        for r in run.rounds[1:]:
            kinds[r.drafter] = kinds.get(r.drafter, 0) + 1
    assert kinds["prompt-lookup"] > 0.2 * runs and kinds["model"] > 0.2 * runs  # both kinds of round, often
    exact = {cell: runs * target_probability(target, settings, cell) for cell in itertools.product(range(vocab), repeat=TOKENS)}
    assert pooled_chisquare(observed, {cell: e for cell, e in exact.items() if e > 0}) > 0.001


def test_the_confidence_stop_keeps_the_targets_distribution():
    """A round's drafting stops once the draft's confidence falls below 0.5 (often after its first draft here): the
    number of drafts depends on the draft's own samples, and the output still follows the target."""
    vocab, settings, runs = CASES["temperature"]
    target, draft = FakeModel(vocab, "target"), FakeModel(vocab, "draft")
    observed, drafted = {}, []
    for run in speculative_runs(target, draft, settings, runs, seed=5, p_min=0.5):
        observed[tuple(run.ids)] = observed.get(tuple(run.ids), 0) + 1
        drafted += [r.drafted for r in run.rounds[1:]]
    assert 0.2 < drafted.count(1) / len(drafted) < 0.9  # the stop cut many rounds short, not all
    exact = {cell: runs * target_probability(target, settings, cell) for cell in itertools.product(range(vocab), repeat=TOKENS)}
    assert pooled_chisquare(observed, {cell: e for cell, e in exact.items() if e > 0}) > 0.001


def test_gated_rounds_keep_the_targets_distribution():
    """A round whose draft is unsure (its top probability below 0.7) is a plain target step: whether a round is
    verified depends on the draft's distribution alone, decided before its draft is drawn, and the output still
    follows the target."""
    vocab, settings, runs = CASES["temperature"]
    target, draft = FakeModel(vocab, "target"), FakeModel(vocab, "draft")
    observed, gated = {}, []
    for run in speculative_runs(target, draft, settings, runs, seed=8, gate=0.7):
        observed[tuple(run.ids)] = observed.get(tuple(run.ids), 0) + 1
        gated += [r.gated for r in run.rounds[1:] if r.k]
    assert 0.2 < sum(gated) / len(gated) < 0.8  # the gate turned many rounds back, not all
    exact = {cell: runs * target_probability(target, settings, cell) for cell in itertools.product(range(vocab), repeat=TOKENS)}
    assert pooled_chisquare(observed, {cell: e for cell, e in exact.items() if e > 0}) > 0.001


class GateOnTheDrawnDraft(ModelDrafter):
    """The gate done wrong: a round's first draft thrown back, after the draw, for its own low q(x)."""

    def __init__(self, *args, wrong_gate: float):
        super().__init__(*args)
        self.wrong_gate = wrong_gate

    def propose(self, seq, k):
        proposal = super().propose(seq, k)
        if proposal.tokens and proposal.q[0, proposal.tokens[0]] < self.wrong_gate:
            self.model.rollback(len(seq))
            return Proposal([], None, proposal.calls, proposal.seconds, self.kind)
        return proposal


def test_the_same_check_refuses_a_gate_on_the_drawn_drafts_own_probability():
    # The gated test above must be able to fail: verified drafts are then drawn from q cut to its likely tokens
    vocab, settings, runs = CASES["temperature"]
    target, draft = FakeModel(vocab, "target"), FakeModel(vocab, "draft")
    rng, observed = np.random.default_rng(8), {}
    drafter = GateOnTheDrawnDraft(draft, settings, rng, wrong_gate=0.7)
    for _ in range(runs):
        run = drain(loops.speculative(target, drafter, FakeTokenizer(), PROMPT, settings, set(), rng=rng))
        observed[tuple(run.ids)] = observed.get(tuple(run.ids), 0) + 1
    exact = {cell: runs * target_probability(target, settings, cell) for cell in itertools.product(range(vocab), repeat=TOKENS)}
    assert pooled_chisquare(observed, {cell: e for cell, e in exact.items() if e > 0}) < 1e-6


def test_the_same_check_refuses_the_drafts_own_distribution():
    # The test above must be able to fail: the draft model's own sequences do not follow the target.
    vocab, settings, runs = CASES["temperature"]
    target, draft = FakeModel(vocab, "target"), FakeModel(vocab, "draft")
    rng, observed = np.random.default_rng(7), {}
    for _ in range(runs):
        draft.reset()
        cell = tuple(ModelDrafter(draft, settings, rng).propose(PROMPT, TOKENS).tokens)
        observed[cell] = observed.get(cell, 0) + 1
    exact = {cell: runs * target_probability(target, settings, cell) for cell in itertools.product(range(vocab), repeat=TOKENS)}
    assert pooled_chisquare(observed, exact) < 1e-6


@pytest.mark.parametrize("case", CASES)
def test_after_every_run_the_caches_hold_the_text_but_its_last_token(case):
    """The target's cache holds exactly prompt + answer but its last token (the loop's invariant); the
    draft's holds a prefix of that: rollbacks cut at the right place and nothing unverified stays."""
    vocab, settings, _ = CASES[case]
    target, draft = FakeModel(vocab, "target"), FakeModel(vocab, "draft")
    long = replace(settings, max_new_tokens=30, k_policy=KPolicy.fixed(3))
    for run in speculative_runs(target, draft, long, 50, seed=5):
        text = PROMPT + run.ids
        assert run.summary.tokens == len(run.ids) == 30
        assert target.cache == text[:-1]
        assert draft.cache == text[: draft.length]
