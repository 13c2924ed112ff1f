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
from typing import Iterator

import numpy as np

from specdemo.drafting import Drafter
from specdemo.events import ACCEPTED, BONUS, CORRECTED, TARGET, Detokenizer, Summary, TokenEvent, expected_speedup
from specdemo.runtime import OVModel
from specdemo.settings import GenerationSettings
from specdemo.verification import NEAR_TIE_LOGIT_GAP, process_logits, sample, top2_gap, verify_greedy, verify_sampled

Event = TokenEvent | Summary


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
) -> Iterator[Event]:
    """Draft K tokens, score them all with one target call, keep the accepted prefix, repeat."""
    start = time.perf_counter()
    target.reset()
    drafter.reset()
    rng = rng if rng is not None else np.random.default_rng(settings.seed)
    out = _Emitter(tokenizer, prompt_ids, settings, eos_ids, start)
    seq = list(prompt_ids)
    histogram = [0] * ((settings.k_max if settings.adaptive else settings.k) + 1)  # rounds by drafts kept
    proposed = accepted = rounds = 0

    # Prefill: the first token is the target's own.
    row = target.forward(prompt_ids)[0]
    token, extra = _choose(row, settings, rng)
    seq.append(token)
    yield out.emit(token, TARGET, step=0, **extra)

    k = settings.k
    while not out.stop_reason and not _cancelled(cancel):
        # Never draft past max_new_tokens: a round emits at most k + 1 tokens.
        proposal = drafter.propose(seq, min(k, out.remaining - 1))
        drafts = proposal.tokens
        if _cancelled(cancel):
            drafter.keep(len(seq))  # drop the unverified proposals: the draft cache stays a prefix of seq
            break
        logits = target.forward([seq[-1]] + drafts, logits_to_keep=len(drafts) + 1)  # (K+1, V)
        if settings.greedy:
            n, token = verify_greedy(drafts, logits)
            margins = [top2_gap(logits[i]) for i in range(n + 1)]
            p_rows = None
        else:
            p_rows = process_logits(logits, settings)
            n, token = verify_sampled(drafts, proposal.q, p_rows, rng)
        kept = len(seq) + n
        target.rollback(kept)
        drafter.keep(kept)

        rounds += 1
        proposed += len(drafts)
        accepted += n
        histogram[n] += 1
        step = target.calls - 1
        for i, draft in enumerate(drafts[:n]):
            seq.append(draft)
            extra = {"margin": margins[i]} if p_rows is None else {"p_target": float(p_rows[i, draft])}
            if proposal.q is not None:
                extra["p_draft"] = float(proposal.q[i, draft])
            yield out.emit(draft, ACCEPTED, step, **extra)
            if out.stop_reason:
                break
        if out.stop_reason:
            break
        seq.append(token)
        source = TARGET if not drafts else (BONUS if n == len(drafts) else CORRECTED)
        extra = {"rejected": drafts[n:]} if n < len(drafts) else {}
        if p_rows is None:
            extra["margin"] = margins[n]
        else:
            extra["p_target"] = float(p_rows[n, token])
        yield out.emit(token, source, step, **extra)

        if settings.adaptive and drafts:
            k = min(k + 1, settings.k_max) if n == len(drafts) else max(k - 1, settings.k_min)

    summary = out.summary("speculative")
    target_steps = target.calls - 1
    draft_model = getattr(drafter, "model", None)
    summary.target_calls = target.calls
    summary.draft_calls = drafter.calls
    summary.proposed = proposed
    summary.accepted = accepted
    summary.acceptance_rate = accepted / proposed if proposed else 0.0
    summary.tokens_per_call = (summary.tokens - 1) / target_steps if target_steps else 0.0
    summary.accepted_histogram = histogram
    summary.target_s = target.infer_s
    summary.draft_s = drafter.busy_s
    summary.rollback_s = target.rollback_s + (draft_model.rollback_s if draft_model else 0.0)
    summary.target_step_s = _mean_step_without_first(target) if target_steps else 0.0
    summary.draft_step_s = drafter.busy_s / drafter.calls if drafter.calls else 0.0
    if draft_model is not None and draft_model.calls > 1:
        # The draft's first call is its prefill; leave it out of the per-step cost.
        summary.draft_step_s = _mean_step_without_first(draft_model)
    summary.cost_ratio = summary.draft_step_s / summary.target_step_s if summary.target_step_s else 0.0
    summary.mean_k = proposed / rounds if rounds else 0.0
    summary.expected_speedup = expected_speedup(summary.acceptance_rate, summary.mean_k, summary.cost_ratio)
    summary.kv_cache_bytes = {"target": target.kv_cache_bytes()}
    if draft_model is not None:
        summary.kv_cache_bytes["draft"] = draft_model.kv_cache_bytes()
    yield summary


def _mean_step_without_first(model: OVModel) -> float:
    return (model.infer_s - model.first_call_s) / (model.calls - 1)
