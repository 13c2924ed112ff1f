"""The two decoding loops. Both yield a TokenEvent per token as it is decided and a Round per target call (what
was drafted, accepted and emitted, and what each call cost), then one End. They record and count nothing else:
specdemo/results/metrics.py derives every figure from the records.

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

from specdemo.decoding.drafters import Drafter, Proposal
from specdemo.decoding.events import ACCEPTED, BONUS, CORRECTED, TARGET, Detokenizer, End, Round, TokenEvent
from specdemo.decoding.planner import PROBE_ROUNDS, Plan, rule_of
from specdemo.decoding.verification import process_logits, sample, shared_vocabulary, top2_gap, verify_greedy, verify_sampled
from specdemo.models.runtime import OVModel
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.settings import GenerationSettings

Event = TokenEvent | Round | End


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

    @property
    def remaining(self) -> int:
        return self.settings.max_new_tokens - len(self.ids)

    def now(self) -> float:
        return time.perf_counter() - self.start

    def emit(self, token: int, source: str, step: int, **extra) -> TokenEvent:
        self.ids.append(token)
        if "rejected" in extra:
            extra["rejected_text"] = self.tokenizer.decode(extra["rejected"], skip_special_tokens=True)
        if token in self.eos_ids:
            self.stop_reason = "eos"
        elif self.remaining <= 0:
            self.stop_reason = "max_new_tokens"
        return TokenEvent(id=token, text=self.detokenizer.add(token), source=source, step=step, t=self.now(), **extra)

    def end(self, mode: str, prompt_tokens: int, kv_cache_bytes: dict[str, int], **fields) -> End:
        return End(mode=mode, stop_reason=self.stop_reason or "cancelled", wall_s=self.now(), prompt_tokens=prompt_tokens,
                   kv_cache_bytes=kv_cache_bytes, **fields)


def _choose(logits_row: np.ndarray, settings: GenerationSettings, rng: np.random.Generator) -> tuple[int, dict]:
    """The target's own next token from one row of logits (V,), with its margin (greedy) or probability."""
    if settings.greedy:
        return int(logits_row.argmax()), {"margin": top2_gap(logits_row)}
    p = process_logits(logits_row[None, :], settings)[0]
    token = sample(p, rng)
    return token, {"p_target": float(p[token])}


def _cancelled(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


def _step(index: int, context: int, tokens: int, seconds: float, t: float, rollback_s: float = 0.0) -> Round:
    """The record of a plain target call (the prefill, an autoregressive step, a round at K = 0, a re-scoring probe)."""
    return Round(index=index, context=context, k=0, drafter="", draft_calls=[], draft_s=0.0, verify_tokens=tokens,
                 verify_s=seconds, drafted=0, accepted=0, emitted=1, rollback_s=rollback_s, t=t)


def autoregressive(
    target: OVModel,
    tokenizer,
    prompt_ids: list[int],
    settings: GenerationSettings,
    eos_ids: set[int],
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """Target-only decoding with its KV cache: one target call per token, each recorded as a Round."""
    start = time.perf_counter()
    target.reset()
    rng = np.random.default_rng(settings.seed)
    out = _Emitter(tokenizer, prompt_ids, settings, eos_ids, start)
    feed = prompt_ids
    while not out.stop_reason and not _cancelled(cancel):
        context = target.length
        token, extra = _choose(target.forward(feed)[0], settings, rng)
        yield out.emit(token, TARGET, step=target.calls - 1, **extra)
        yield _step(target.calls - 1, context, len(feed), target.last_call_s, out.now())
        feed = [token]
    yield out.end(AUTOREGRESSIVE, len(prompt_ids), {"target": target.kv_cache_bytes()})


def speculative(
    target: OVModel,
    drafter: Drafter,
    tokenizer,
    prompt_ids: list[int],
    settings: GenerationSettings,
    eos_ids: set[int],
    cancel: threading.Event | None = None,
    rng: np.random.Generator | None = None,
    plan: Plan | None = None,
) -> Iterator[Event]:
    """Draft K tokens, score them all with one target call, keep the accepted prefix, repeat.

    `plan.rule()` gives each round's K from the rounds so far (no plan: the settings' fixed or grow/shrink
    rule); K = 0 makes a round one plain target step. The costs the plan was priced by are handed on in
    the End so the summary can predict the speedup for this machine.
    """
    start = time.perf_counter()
    target.reset()
    drafter.reset()
    rng = rng if rng is not None else np.random.default_rng(settings.seed)
    rule = plan.rule() if plan is not None else rule_of(settings.k_policy)
    probes = PROBE_ROUNDS if plan is not None and plan.rescore else 0  # re-scoring probes still to make
    out = _Emitter(tokenizer, prompt_ids, settings, eos_ids, start)
    seq = list(prompt_ids)
    rounds: list[Round] = []

    # Prefill: the first token is the target's own.
    row = target.forward(prompt_ids)[0]
    token, extra = _choose(row, settings, rng)
    seq.append(token)
    yield out.emit(token, TARGET, step=0, **extra)
    rounds.append(_step(0, 0, len(prompt_ids), target.last_call_s, out.now()))
    yield rounds[-1]

    while not out.stop_reason and not _cancelled(cancel):
        if probes and len(seq) > plan.rescore:  # the plan found no fixed K that pays on a curve no run has checked
            probes -= 1
            yield from _rescored_step(target, seq, plan.rescore, settings, rng, out, rounds)
            continue
        k = rule.next_k(rounds)
        context = len(seq) - 1  # the target's cache holds seq but its last token
        # Never draft past max_new_tokens: a round emits at most k + 1 tokens.
        proposal = drafter.propose(seq, min(k, out.remaining - 1)) if k else Proposal([], None)
        if _cancelled(cancel):
            drafter.keep(len(seq))  # drop the unverified proposals: the draft cache stays a prefix of seq
            break
        drafts = proposal.tokens
        n, token, extras = _verify_round(target, seq, proposal, settings, rng)
        verify_s = target.last_call_s
        began = time.perf_counter()
        target.rollback(len(seq) + n)
        drafter.keep(len(seq) + n)
        rollback_s = time.perf_counter() - began
        step = target.calls - 1
        emitted = []
        for i, draft in enumerate(drafts[:n]):
            seq.append(draft)
            emitted.append(out.emit(draft, ACCEPTED, step, **extras[i]))
            if out.stop_reason:  # an EOS among the accepted drafts ends the text there
                break
        if not out.stop_reason:
            seq.append(token)
            source = TARGET if not drafts else (BONUS if n == len(drafts) else CORRECTED)
            if n < len(drafts):
                extras[n]["rejected"] = drafts[n:]
            emitted.append(out.emit(token, source, step, **extras[n]))
        yield from emitted
        rounds.append(Round(index=step, context=context, k=k, drafter=(proposal.drafter or drafter.kind) if drafts else "",
                            draft_calls=proposal.calls, draft_s=proposal.seconds, verify_tokens=len(drafts) + 1,
                            verify_s=verify_s, drafted=len(drafts), accepted=n, emitted=len(emitted),
                            rollback_s=rollback_s, t=out.now()))
        yield rounds[-1]

    kv = {"target": target.kv_cache_bytes(), **drafter.kv_cache_bytes()}
    yield out.end(SPECULATIVE, len(prompt_ids), kv, k_max=settings.k_max, drafter=drafter.kind)


def _rescored_step(target: OVModel, seq: list[int], tokens: int, settings: GenerationSettings, rng: np.random.Generator,
                   out: _Emitter, rounds: list[Round]) -> Iterator[Event]:
    """A plain step paid as a verify call of `tokens` tokens (a re-scoring probe, planner.PROBE_ROUNDS): the target's
    cache rolled back by tokens - 1 and seq's last `tokens` fed again, every row kept as a round's verify keeps them.
    The last row gives the step's token, as a plain step's would. Appends the token to seq and its Round to rounds."""
    context = len(seq) - tokens
    began = time.perf_counter()
    target.rollback(context)
    rollback_s = time.perf_counter() - began
    token, extra = _choose(target.forward(seq[-tokens:], logits_to_keep=tokens)[-1], settings, rng)
    seq.append(token)
    yield out.emit(token, TARGET, step=target.calls - 1, **extra)
    rounds.append(_step(target.calls - 1, context, tokens, target.last_call_s, out.now(), rollback_s))
    yield rounds[-1]


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
    logits, q = shared_vocabulary(logits, proposal.q)
    p = process_logits(logits, settings)
    n, token = verify_sampled(drafts, q, p, rng)
    chosen = drafts[:n] + [token]
    extras = [{"p_target": float(p[i, x])} for i, x in enumerate(chosen)]
    if q is not None:
        for i, x in enumerate(drafts[:n]):
            extras[i]["p_draft"] = float(q[i, x])
    return n, token, extras
