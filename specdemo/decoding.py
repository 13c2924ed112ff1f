"""The two decoding loops. Both yield TokenEvents as tokens are decided, then one Summary.

Cache invariant shared by both loops (as in gpt-fast): every model's KV cache holds the sequence
*except its last token*, whose logits are still to be computed. A step therefore feeds the last
token (plus any draft tokens) and gets scores for what follows.

Speculative round, with seq = prompt + tokens so far and K draft tokens d1..dK:
    target.forward([seq[-1], d1..dK])  ->  K+1 rows of logits; row i scores the slot of d(i+1)
    accept n drafts, then one more token t (the correction at n, or the bonus when n == K)
    roll both caches back to len(seq) + n tokens: seq + d1..dn are kept, t is fed next round.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, Protocol

import numpy as np

from specdemo.costs import CostModel
from specdemo.drafting import Drafter, Proposal
from specdemo.events import ACCEPTED, BONUS, CORRECTED, TARGET, Detokenizer, Summary, TokenEvent, expected_speedup
from specdemo.planner import FixedK, GrowShrinkK, estimate_alpha, predicted_lane_speedup
from specdemo.runtime import OVModel
from specdemo.settings import GenerationSettings
from specdemo.verification import NEAR_TIE_LOGIT_GAP, process_logits, sample, top2_gap, verify_greedy, verify_sampled

Event = TokenEvent | Summary


class KPolicy(Protocol):
    def next_k(self, accepted: int, rejections: int, last_full: bool | None) -> int: ...


class _Emitter:
    """Turns decided token ids into TokenEvents and knows when to stop."""

    def __init__(self, tokenizer, prompt_ids: list[int], settings: GenerationSettings, eos_ids: set[int], start: float):
        self.detokenizer = Detokenizer(tokenizer, prompt_ids)
        self.tokenizer = tokenizer
        self.settings = settings
        self.eos_ids = eos_ids
        self.start = start
        self.ids: list[int] = []
        self.stop_reason = ""
        self.first_t = 0.0
        self.near_ties = 0

    @property
    def remaining(self) -> int:
        return self.settings.max_new_tokens - len(self.ids)

    def emit(self, token: int, source: str, step: int, **extra) -> TokenEvent:
        t = time.perf_counter() - self.start
        if not self.ids:
            self.first_t = t
        self.ids.append(token)
        if "rejected" in extra:
            extra["rejected_text"] = self.tokenizer.decode(extra["rejected"], skip_special_tokens=True)
        if extra.get("margin") is not None and extra["margin"] < NEAR_TIE_LOGIT_GAP:
            self.near_ties += 1
        if token in self.eos_ids:
            self.stop_reason = "eos"
        elif self.remaining <= 0:
            self.stop_reason = "max_new_tokens"
        return TokenEvent(id=token, text=self.detokenizer.add(token), source=source, step=step, t=t, **extra)

    def summary(self, mode: str) -> Summary:
        wall = time.perf_counter() - self.start
        return Summary(
            mode=mode,
            tokens=len(self.ids),
            wall_s=wall,
            ttft_s=self.first_t,
            tokens_per_s=len(self.ids) / wall if wall > 0 else 0.0,
            stop_reason=self.stop_reason or "cancelled",
            near_ties=self.near_ties,
        )


def _choose(logits_row: np.ndarray, settings: GenerationSettings, rng: np.random.Generator) -> tuple[int, dict]:
    """The target's own next token from one row of logits (V,), with its margin (greedy) or probability."""
    if settings.greedy:
        return int(logits_row.argmax()), {"margin": top2_gap(logits_row)}
    p = process_logits(logits_row[None, :], settings)[0]
    token = sample(p, rng)
    return token, {"p_target": float(p[token])}


def _cancelled(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


def autoregressive(
    target: OVModel,
    tokenizer,
    prompt_ids: list[int],
    settings: GenerationSettings,
    eos_ids: set[int],
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """Target-only decoding with its KV cache: one target call per token."""
    start = time.perf_counter()
    target.reset()
    rng = np.random.default_rng(settings.seed)
    out = _Emitter(tokenizer, prompt_ids, settings, eos_ids, start)
    feed = prompt_ids
    while not out.stop_reason and not _cancelled(cancel):
        token, extra = _choose(target.forward(feed)[0], settings, rng)
        yield out.emit(token, TARGET, step=target.calls - 1, **extra)
        feed = [token]
    summary = out.summary("autoregressive")
    summary.target_calls = target.calls
    summary.target_s = target.infer_s
    summary.target_step_s = target.mean_step_s
    summary.kv_cache_bytes = {"target": target.kv_cache_bytes()}
    yield summary


def speculative(
    target: OVModel,
    drafter: Drafter,
    tokenizer,
    prompt_ids: list[int],
    settings: GenerationSettings,
    eos_ids: set[int],
    cancel: threading.Event | None = None,
    rng: np.random.Generator | None = None,
    policy: KPolicy | None = None,
    costs: CostModel | None = None,
) -> Iterator[Event]:
    """Draft K tokens, score them all with one target call, keep the accepted prefix, repeat.

    `policy` gives each round's K (default: settings.k, or the grow/shrink rule when adaptive); K = 0
    makes a round one plain target step. With `costs` the summary predicts the speedup from this
    machine's measured call times.
    """
    start = time.perf_counter()
    target.reset()
    drafter.reset()
    rng = rng if rng is not None else np.random.default_rng(settings.seed)
    policy = policy or default_policy(settings)
    out = _Emitter(tokenizer, prompt_ids, settings, eos_ids, start)
    seq = list(prompt_ids)
    tally = _Tally(settings.k_max if settings.adaptive or settings.k_auto else settings.k)

    # Prefill: the first token is the target's own.
    row = target.forward(prompt_ids)[0]
    token, extra = _choose(row, settings, rng)
    seq.append(token)
    yield out.emit(token, TARGET, step=0, **extra)

    last_full = None
    while not out.stop_reason and not _cancelled(cancel):
        k = policy.next_k(tally.accepted, tally.rejections, last_full)
        # Never draft past max_new_tokens: a round emits at most k + 1 tokens.
        proposal = drafter.propose(seq, min(k, out.remaining - 1)) if k else Proposal([], None)
        if _cancelled(cancel):
            drafter.keep(len(seq))  # drop the unverified proposals: the draft cache stays a prefix of seq
            break
        drafts = proposal.tokens
        n, token, extras = _verify_round(target, seq, proposal, settings, rng)
        target.rollback(len(seq) + n)
        drafter.keep(len(seq) + n)
        step = target.calls - 1
        emitted = 0
        for i, draft in enumerate(drafts[:n]):
            seq.append(draft)
            emitted += 1
            yield out.emit(draft, ACCEPTED, step, **extras[i])
            if out.stop_reason:  # an EOS among the accepted drafts ends the text there
                break
        if drafts:
            tally.add(len(drafts), emitted, rejected=emitted == n and n < len(drafts))
            last_full = n == len(drafts)
        if out.stop_reason:
            break
        seq.append(token)
        source = TARGET if not drafts else (BONUS if n == len(drafts) else CORRECTED)
        if n < len(drafts):
            extras[n]["rejected"] = drafts[n:]
        yield out.emit(token, source, step, **extras[n])

    yield _speculative_summary(out, target, drafter, tally, costs, len(prompt_ids))


def default_policy(settings: GenerationSettings) -> KPolicy:
    """The K policy the settings ask for when no planner gives one: fixed K, or grow/shrink when adaptive."""
    if settings.adaptive:
        return GrowShrinkK(settings.k, settings.k_min, settings.k_max)
    return FixedK(settings.k)


def _verify_round(target: OVModel, seq: list[int], proposal: Proposal, settings: GenerationSettings,
                  rng: np.random.Generator) -> tuple[int, int, list[dict]]:
    """Score seq's last token and the drafts in one target call; apply the acceptance rule.

    Returns (n drafts accepted, the target's token after them, per-position event fields for the n
    accepted drafts and that token: the margin when greedy, p_target and p_draft when sampling).
    The caller rolls the caches back to len(seq) + n.
    """
    drafts = proposal.tokens
    logits = target.forward([seq[-1]] + drafts, logits_to_keep=len(drafts) + 1)  # (K+1, V)
    if settings.greedy:
        n, token = verify_greedy(drafts, logits)
        return n, token, [{"margin": top2_gap(logits[i])} for i in range(n + 1)]
    p = process_logits(logits, settings)
    n, token = verify_sampled(drafts, proposal.q, p, rng)
    chosen = drafts[:n] + [token]
    extras = [{"p_target": float(p[i, x])} for i, x in enumerate(chosen)]
    if proposal.q is not None:
        for i, x in enumerate(drafts[:n]):
            extras[i]["p_draft"] = float(proposal.q[i, x])
    return n, token, extras


class _Tally:
    """The speculative lane's counts: drafts proposed and accepted, rounds, rejections, the histogram."""

    def __init__(self, k_max: int):
        self.proposed = self.accepted = self.rounds = self.rejections = 0
        self.histogram = [0] * (k_max + 1)  # rounds by how many of their drafts were kept

    def add(self, proposed: int, accepted: int, rejected: bool) -> None:
        self.rounds += 1
        self.proposed += proposed
        self.accepted += accepted
        self.rejections += rejected
        self.histogram[accepted] += 1


def _speculative_summary(out: _Emitter, target: OVModel, drafter: Drafter, tally: _Tally, costs: CostModel | None,
                         prompt_tokens: int) -> Summary:
    summary = out.summary("speculative")
    target_steps = target.calls - 1
    summary.target_calls = target.calls
    summary.draft_calls = drafter.calls
    summary.proposed = tally.proposed
    summary.accepted = tally.accepted
    summary.rounds = tally.rounds
    summary.rejections = tally.rejections
    summary.draft_acceptance_rate = tally.accepted / tally.proposed if tally.proposed else 0.0
    summary.alpha = estimate_alpha(tally.accepted, tally.rejections, prior=0.0, weight=0.0)
    summary.tokens_per_call = (summary.tokens - 1) / target_steps if target_steps else 0.0
    summary.accepted_histogram = tally.histogram
    summary.target_s = target.infer_s
    summary.draft_s = drafter.busy_s
    summary.rollback_s = target.rollback_s + drafter.rollback_s
    summary.target_step_s = target.mean_step_s
    summary.draft_step_s = drafter.step_s
    summary.cost_ratio = summary.draft_step_s / summary.target_step_s if summary.target_step_s else 0.0
    summary.mean_k = tally.proposed / tally.rounds if tally.rounds else 0.0
    summary.expected_speedup = expected_speedup(summary.alpha, summary.mean_k, summary.cost_ratio)
    if costs is not None:
        summary.predicted_speedup = predicted_lane_speedup(
            costs, summary.alpha, summary.mean_k, summary.tokens, prompt_tokens, drafter.kind
        )
    summary.kv_cache_bytes = {"target": target.kv_cache_bytes(), **drafter.kv_cache_bytes()}
    return summary
