"""Which draft to run on this machine: its LM-head size and weight precision, chosen by predicted speedup.

A draft is only worth what it buys: a cheaper draft step (an LM head trimmed to the most frequent tokens, or other
weights) pays only if the acceptance it loses costs less. Which side wins depends on the CPU: where a draft step
costs half a target step (an AVX2-only CPU) a 15 % cheaper step is worth a lot; where it costs a quarter (AMX), the
same step saved is worth little and the lost acceptance decides. So `python -m specdemo tune` measures each candidate
draft here, with the tuned target loaded:

* its draft step, as a round makes it (race.sample_draft), raced against the incumbent draft (race.race: until the
  ratio of their steps is clear of MARGIN, or a cap), two drafts at a time; a trimmed head on our kernels, which takes
  its other rows where the kept rows may not hold its choice (split_head), with them for the share of its choices that
  took them (with_rest);
* its acceptance by draft position, exactly, on the built-in answers of every kind the page offers (code, prose, French,
  Chinese, Russian: builtin.DRAFT_PLAN_ANSWERS, where it says why): where its greedy token equals the target's, teacher
  forced (counterfactual.greedy_choices; the target's choices computed once);

and prices each with the planner (the target's measured cost curve, the draft's calls scaled by the candidate's step
time): the predicted speedup at its best K. The configured draft (its precision, the full head) stays unless another
is predicted at least MARGIN faster. Every candidate is lossless: the target checks every token.

A draft whose precision is left to the plan (`auto`, the default draft's) gets the chosen option, precision and head
(Profile.resolve), among the precisions prepared here; a draft with an explicit precision gets the best head of that
precision by the same rule, and a head given explicitly is kept. Another precision is priced only when its IR is
already prepared (the page's background work prepares the default draft's INT8 before it tunes).

**Only what could change the plan is measured.** Measuring five drafts took 4.3 min on a 2-core Zen 3 where no draft
could pay at all (issue 48). So before anything is measured each candidate is priced at its best case on the target's
quick cost curve (best_case): acceptance CEILING at every draft position and the cheapest step its bytes allow
(step_floor). Where no candidate could pay even so, nothing is measured and the incumbent stays with K = 0; once the
incumbent is measured, a challenger is compiled, measured and raced only if its best case could beat the incumbent's
price by MARGIN. Each one left out says so in one line of the tune's log, and its row in the table.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field, replace

from specdemo.decoding import pricing
from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import MASKED_STRATEGY
from specdemo.decoding.pricing import Acceptance
from specdemo.host import memory
from specdemo.models import kernels, sources
from specdemo.settings import AUTO, DRAFT_PRECISION, FIRST_DRAFT_PRECISIONS, K_MAX, ModelSettings

HEADS = (0, 32_000, 16_000, 8_000)  # LM-head sizes tried (0: the full vocabulary)
PRECISIONS = ("int4", "int8")  # the plugin's draft weight precisions priced when prepared (ours: to_price)
MARGIN = 0.03  # another draft replaces the configured one only if predicted at least this much faster
# The acceptance a candidate is priced at before it is measured, at every draft position: above any draft of the default
# pair measured so far (92.2 % of tested drafts for the INT4 full head, 94.0 % for INT8, 83-89 % for trimmed heads on
# the built-in answers, Zen 5; on HumanEval 95 % at the first position, falling to 76 % at the 12th), so a draft that
# cannot pay at it cannot pay at what it would measure. Not 1.0: a draft that is another model never agrees everywhere,
# and at 1.0 a long enough round "pays" on any curve (5 tokens for 2.4 steps, a draft step 0.45: 1.21× at K = 12,
# 1.09× at 0.97). A pair whose incumbent is measured above it is priced at 1.0 from then on (measure).
CEILING = 0.97
# Bits per weight of the precisions a draft may take (others: taken as 16). The GGUF layouts (a first start's draft,
# settings.FIRST_DRAFT_PRECISIONS) at most Q8_0's 8.5 (gguf-mixed's per-channel INT8 8, a Q4_K file fewer): a challenger's
# step floor beside them errs low, so it is measured rather than wrongly left out.
BITS = {"fp16": 16, "int8": 8, "int4": 4, **dict.fromkeys(("gguf", "gguf-mixed", "gguf-native"), 8.5), "gguf-q4": 4.5}
# ON_OTHER_KERNELS: a draft on specdemo's kernels (gguf-native) beside one on the plugin's, or the other way round, is
# never priced by its bits: the kernels differ more than the bytes. The 0.5B draft's INT4 (4 bits) stepped at 0.95-1.0
# of the 1.5B target's step on the 2-core Zen 3 (EPYC family 25 model 1: the plugin's INT4 on AVX2 without VNNI), its
# gguf-native (5-8.5 bits) at 0.44-0.54, and 0.36-0.40 with a 16k head.


@dataclass
class DraftOption:
    """One candidate draft, as measured and priced here."""

    precision: str
    head_tokens: int  # 0: the full head
    rows: int = 0  # rows its LM head keeps
    step_s: float = math.nan  # a draft step inside a round, in the race
    tested: list[int] = field(default_factory=list)  # drafts tested at positions 1 … K_MAX on the built-in answers
    accepted: list[int] = field(default_factory=list)  # of them, equal to the target's greedy token
    k: int = 0  # its best K on this machine
    predicted_speedup: float = math.nan  # at that K, over the target alone
    applies: bool = True  # whether the configured draft may run it (its precision, or any when the precision is auto)
    chosen: bool = False
    measured: bool = True  # False: left out, its best case could not change the plan (best_case says what it was)
    best_case: float = math.nan  # its predicted speedup at the best K, at acceptance CEILING and its step_floor
    # Of its greedy choices on the built-in answers, the share that took a trimmed head's other rows too (unsure or
    # foreign: split_head); its step_s counts them at what the full head's step costs more (with_rest)
    rest_share: float = 0.0
    # Why its price may not be the quiet host's, in one sentence (race.Verdict.busy of its race, or the cost curve's
    # CostModel.busy); "" when measured clean
    provisional: str = ""

    def describe(self) -> str:
        head = "full head" if not self.head_tokens else f"head {self.head_tokens // 1000}k"
        return f"{self.precision}, {head}"

    def acceptance(self) -> Acceptance:
        return Acceptance.from_counts(self.tested, self.accepted, Acceptance.geometric(MASKED_STRATEGY.planning.default_alpha))

    def acceptance_rate(self) -> float:
        """Accepted ÷ tested over every position: one number for the table."""
        return sum(self.accepted) / sum(self.tested) if sum(self.tested) else math.nan

    def left_out(self) -> str:
        """The tune's line for an option not measured."""
        return (f"draft {self.describe()}: not measured: at best {self.best_case:.2f}× at any acceptance it could reach "
                "on this machine's curve")


def to_price(draft: ModelSettings) -> tuple[str, ...]:
    """The weight precisions the plan prices for an auto `draft`, each where prepared: the plugin's (PRECISIONS), and
    for a GGUF where specdemo's kernels run, the file's blocks on them as the file holds them (gguf-native) and in 4
    bits (gguf-q4)."""
    return PRECISIONS + (kernels.runnable(kernels.ON_KERNELS) if sources.is_gguf(draft.source) else ())


def to_prepare(draft: ModelSettings) -> tuple[str, ...]:
    """What the page's background prepares for the plan to price (to_price) but a first start does not
    (settings.FIRST_DRAFT_PRECISIONS): the incumbent's precision (DRAFT_PRECISION) first, then ours (gguf-q4: a
    conversion without NNCF, and where our kernels run the likeliest choice), then the plugin's others."""
    ours = tuple(p for p in to_price(draft) if p in kernels.ON_KERNELS and p not in FIRST_DRAFT_PRECISIONS)
    return (DRAFT_PRECISION, *ours, *(p for p in PRECISIONS if p != DRAFT_PRECISION))


def candidates(draft: ModelSettings, prepared) -> list[ModelSettings]:
    """The configured draft (an auto precision: DRAFT_PRECISION) with the full head first (the incumbent), then trimmed
    heads; for an auto draft of a GGUF where specdemo's kernels run, the file's blocks on them (gguf-native, gguf-q4)
    with each head; then the plugin's other precisions. Each only where `prepared(settings)` says its IR is ready
    (converting one would take minutes of a user's first day; a first start prepares gguf-native,
    settings.FIRST_DRAFT_PRECISIONS)."""
    auto = draft.precision == AUTO
    if auto:
        draft = replace(draft, precision=DRAFT_PRECISION)
    out = [replace(draft, head_tokens=h) for h in HEADS]
    if auto:
        ours = [replace(draft, precision=p, head_tokens=0) for p in to_price(draft) if p in kernels.ON_KERNELS]
        out += [replace(settings, head_tokens=h) for settings in ours if prepared(settings) for h in HEADS]
    out += [replace(draft, precision=p, head_tokens=0) for p in PRECISIONS if p != draft.precision
            and prepared(replace(draft, precision=p, head_tokens=0))]
    return out


def head_share(config: dict) -> float:
    """The LM head's share of the weights a draft step reads (config.json of a Llama-like model: Qwen2.5 0.5B, 151,936
    × 896 of 494 M parameters, 0.28); 1.0 where the config does not say (a trimmed head is then priced as nearly free,
    so it is measured). On a compute-bound CPU a step's work is its weights; where memory-bound, their bytes: a trimmed
    head saves at most this share (measured: an 8k head saved 15 % of the Zen 5's step)."""
    try:
        hidden, vocab, layers = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
        heads = config["num_attention_heads"]
        kv = config.get("num_key_value_heads", heads) * config.get("head_dim", hidden // heads)
        layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * config["intermediate_size"]
    except (KeyError, TypeError, ZeroDivisionError):
        return 1.0
    return vocab * hidden / (vocab * hidden + layers * layer)


def step_floor(settings: ModelSettings, incumbent: ModelSettings, rows: int, share: float) -> float:
    """The cheapest `settings`' draft step could be, over the incumbent's (a full head): the rows its head drops (of
    the full head's `rows`; all of them when `rows` is 0, unknown) save at most their part of the head's `share`; fewer
    bits per weight at most their part of the bytes, more bits nothing (INT8 reads twice INT4's bytes and multiplies as
    many weights: its step was 1.5× INT4's on a Zen 5); 0 (unknown: measured) beside a draft on other kernels
    (ON_OTHER_KERNELS)."""
    if (settings.precision in kernels.ON_KERNELS) != (incumbent.precision in kernels.ON_KERNELS):
        return 0.0  # other kernels: bits say nothing of the step (ON_OTHER_KERNELS), so it is measured
    ratio = min(1.0, BITS.get(settings.precision, 16) / BITS.get(incumbent.precision, 16))
    if settings.head_tokens:
        kept = min(settings.head_tokens / rows, 1.0) if rows else 0.0
        ratio *= 1 - share * (1 - kept)
    return ratio


def best_case(costs: CostModel, step_ratio: float, ceiling: float = CEILING, k_max: int = K_MAX) -> float:
    """The predicted speedup at the best K of a draft whose step is `step_ratio` of the curve's draft step and whose
    drafts are accepted at `ceiling`: what no measurement of it could exceed. Below 1: no K pays."""
    scaled = replace(costs, draft_s=tuple(d * step_ratio for d in costs.draft_s))
    return max(pricing.predicted_speedup(scaled, Acceptance.geometric(ceiling), k) for k in range(1, k_max + 1))


def could_change(option: DraftOption, incumbent: float = 1.0) -> bool:
    """Whether `option`'s best case could change the plan: beat `incumbent` (its predicted speedup; 1.0, the target
    alone, before it is measured) by MARGIN, as `choose` asks."""
    return option.best_case >= (1 + MARGIN) * max(incumbent, 1.0)


def price(options: list[DraftOption], costs: CostModel, precision: str = AUTO, k_max: int = K_MAX) -> DraftOption:
    """Each option's best K and predicted speedup on this machine, and the one a draft of `precision` runs (marked).
    `costs` is the target's curve with the first option's draft; the others' draft calls are scaled by their step over
    its step, both taken in the same race."""
    base = options[0]
    for option in options:
        if not option.measured:  # it cannot pay here: the plan runs it, if ever, as the target alone
            option.k, option.predicted_speedup = 0, 1.0 if option.best_case < 1 + MARGIN else math.nan
            continue
        scale = option.step_s / base.step_s
        scaled = replace(costs, draft_s=tuple(d * scale for d in costs.draft_s))
        option.k, option.predicted_speedup = pricing.best_k(scaled, option.acceptance(), k_max)
    best = choose(options, precision)
    best.chosen = True
    # A choice rests on every race the plan ran (a busy one may have lost where a quiet one would win) and the curve
    best.provisional = next((o.provisional for o in [best, *options] if o.provisional), costs.busy)
    return best


def choose(options: list[DraftOption], precision: str = AUTO, head_tokens: int = -1) -> DraftOption | None:
    """Which priced option a draft runs: among those its precision and head allow (auto, -1: any), the first (the
    incumbent: the configured precision's full head, as `candidates` orders them), replaced in that order by each
    option predicted at least MARGIN faster than the one chosen so far. None when no option fits.

    MARGIN against the choice so far, not only against the incumbent: two options within MARGIN of each other (the
    32k and 16k heads priced 1.50× and 1.52×) are a tie inside the races' noise, and a tie goes to the earlier one
    (the larger head), so that two homes on one machine reach the same plan (issue 48: two quiet homes chose these
    two heads, each by a few %)."""
    pool = [o for o in options if precision in (AUTO, o.precision) and head_tokens in (-1, o.head_tokens)]
    if not pool:
        return None
    best = pool[0]
    for option in pool[1:]:
        if option.predicted_speedup >= (1 + MARGIN) * max(best.predicted_speedup, 1.0):
            best = option
    return best


def measure(target, draft: ModelSettings, examples: list[dict], encode, prepared, compile, timer, alone, log,
            incumbent=None, costs: CostModel | None = None, share: float = 1.0) -> tuple[list[DraftOption], object]:
    """Every candidate's acceptance on the examples and its draft step in a round, against `target` (a runtime), and
    the incumbent's compiled draft (for the cost curve `price` needs). `encode(example)` gives (prompt ids, answer
    ids); `compile(settings)` a draft runtime, or None when memory does not allow one (the candidate is left out;
    the incumbent cannot be: memory.Short); `timer(incumbent, challenger, target)` a race.Verdict of a draft step in a
    round (race.race over race.sample_draft), `alone(model, target)` a step's seconds when there is no one to race;
    `incumbent`: the first candidate's compile, when the caller holds it already.

    Given `costs` (the target's quick curve with the incumbent as its draft) and `share` (head_share of the draft),
    only what could change the plan is measured: nothing where no candidate could pay at its best case (every option
    comes back unmeasured), and after the incumbent only the challengers whose best case could beat its price by
    MARGIN; the others come back unmeasured, each said in one line of `log`.

    Two drafts at a time beside the target: the incumbent's compile is held while each other candidate is compiled,
    measured, raced against it alone and let go. A candidate's step is the incumbent's first time scaled by their ratio
    in its own race, so the machine's drift between races cancels in what `price` reads (steps over the incumbent's).
    The target's greedy choices on the examples are computed once and compared with each candidate's."""
    from specdemo.results.counterfactual import greedy_choices, mask_counts

    pool, rows = candidates(draft, prepared), incumbent.head_tokens if incumbent is not None else 0
    hoped = lambda settings, ceiling=CEILING: hope(settings, pool[0], rows, share, costs, draft, ceiling)  # noqa: E731
    if costs is not None and not any(could_change(hoped(settings)) for settings in pool):
        return [hoped(settings) for settings in pool], incumbent  # no draft can pay here: nothing measured
    texts = [encode(example) for example in examples]
    theirs = [greedy_choices(target, prompt, text) for prompt, text in texts]
    options, held, priced, ceiling = [], None, 1.0, CEILING  # the incumbent's predicted speedup, once measured
    for settings in pool:
        best = hoped(settings, ceiling) if costs is not None and held is not None else None
        if best is not None and not could_change(best, priced):
            log(f"  {best.left_out()}")
            options.append(best)
            continue
        model = incumbent if held is None and incumbent is not None else compile(settings)
        if model is None:
            if held is None:
                raise memory.Short("memory does not allow the draft plan's incumbent draft; `python -m specdemo tune "
                                   "--draft-plan` tries again")
            continue
        option = DraftOption(settings.precision, settings.head_tokens, rows=model.head_tokens,
                             applies=draft.precision in (AUTO, settings.precision),
                             best_case=best.best_case if best else math.nan)
        option.tested, option.accepted = [0] * K_MAX, [0] * K_MAX
        chosen, unsure = model.greedy_rows, model.rest_rows  # counted since its load
        for (prompt, text), target_choices in zip(texts, theirs):
            mask = [1] + [int(x) for x in greedy_choices(model, prompt, text) == target_choices]
            tested, accepted = mask_counts(mask, K_MAX)
            option.tested = [a + b for a, b in zip(option.tested, tested)]
            option.accepted = [a + b for a, b in zip(option.accepted, accepted)]
        if model.greedy_rows > chosen:
            option.rest_share = (model.rest_rows - unsure) / (model.greedy_rows - chosen)
        rest = f" (its other rows for {option.rest_share:.0%} of its choices)" if option.rest_share else ""
        log(f"  draft {option.describe()} ({option.rows:,} rows): agrees with the target on "
            f"{option.acceptance_rate():.1%} of tested drafts{rest}")
        options.append(option)
        if held is None:
            held = model
            if costs is not None:  # a pair that agrees above CEILING is like none measured: its challengers at 1.0
                priced = pricing.best_k(costs, option.acceptance(), K_MAX)[1]
                ceiling = CEILING if max(option.acceptance().rates) <= CEILING else 1.0
            continue
        verdict = timer(held, model, target)
        if options[0].step_s != options[0].step_s:
            options[0].step_s = verdict.incumbent_s
        option.step_s = options[0].step_s * verdict.ratio
        option.provisional = verdict.busy
        del model
        gc.collect()
    if options[0].step_s != options[0].step_s:  # raced against no one: the curve's step, else timed alone
        options[0].step_s = costs.d(1) if costs is not None else alone(held, target)
    return with_rest(options), held


def with_rest(options: list[DraftOption]) -> list[DraftOption]:
    """`options` with each trimmed head's step counting its other rows (rest_share of its steps) at what its precision's
    full head, raced too, costs more a step (the other rows' own call took 2.4 ms against 2.3 more for the full head,
    on the 2-core Zen 4), or at its own step again where the full head has no step measured."""
    for option in options:
        if option.rest_share:
            full = next((o.step_s for o in options if o.precision == option.precision and not o.head_tokens
                         and o.step_s == o.step_s), math.nan)
            option.step_s += option.rest_share * (max(full - option.step_s, 0.0) if full == full else option.step_s)
    return options


def hope(settings: ModelSettings, incumbent: ModelSettings, rows: int, share: float, costs: CostModel,
         draft: ModelSettings, ceiling: float = CEILING) -> DraftOption:
    """`settings` as an option not measured (yet): its best case on `costs` (the incumbent's curve; `rows` of its
    full head, 0 when unknown: a trimmed head is then priced as free) at its step_floor and `ceiling`."""
    return DraftOption(settings.precision, settings.head_tokens, rows=settings.head_tokens or rows,
                       applies=draft.precision in (AUTO, settings.precision), measured=False,
                       best_case=best_case(costs, step_floor(settings, incumbent, rows, share), ceiling))


def left_out(options: list[DraftOption]) -> str:
    """One sentence for the CLI and the page on the options not measured because they could not pay here ("" when
    every option was measured)."""
    skipped = [o for o in options if not o.measured]
    if not skipped:
        return ""
    best = max(skipped, key=lambda o: o.best_case)
    if len(skipped) == len(options):
        return (f"The draft plan measured nothing: no draft could pay on this machine's cost curve even with "
                f"{CEILING:.0%} of its drafts accepted (at best {best.best_case:.2f}×, {best.describe()}), so "
                f"{options[0].describe()} stays, with K = 0 predicted.")
    return ("Not measured, as they could not change the plan on this machine's cost curve at any acceptance they could "
            f"reach: {'; '.join(f'{o.describe()} (at best {o.best_case:.2f}×)' for o in skipped)}.")


def said(best: DraftOption) -> str:
    """The tune's line for the chosen option, provisional where it was priced on a busy host."""
    line = f"draft plan: {best.describe()} (predicted {best.predicted_speedup:.2f}× at K = {best.k})"
    if best.provisional:
        line += (f"; provisional, {best.provisional}: the next start's background work plans again (a few times at "
                 "most; `tune --draft-plan` on a quieter host does it now)")
    return line


def table(options: list[DraftOption]) -> list[str]:
    """The draft plan as printed by `tune`."""
    lines = [f"{'draft':22}{'head rows':>11}{'step':>10}{'accepted':>10}{'best K':>8}{'predicted':>11}"]
    for o in options:
        mark = "  <- chosen" if o.chosen else ("" if o.applies else "  (another precision: --draft-precision auto may take it)")
        if not o.measured:
            lines.append(f"{o.describe():22}{o.rows:>11,}{'–':>10}{'–':>10}{'–':>8}   not measured: at best "
                         f"{o.best_case:.2f}×{mark}")
            continue
        lines.append(f"{o.describe():22}{o.rows:>11,}{o.step_s * 1e3:>7.1f} ms{o.acceptance_rate():>10.1%}{o.k:>8}"
                     f"{o.predicted_speedup:>10.2f}×{mark}")
    return lines


def to_dict(option: DraftOption) -> dict:
    return {"precision": option.precision, "head_tokens": option.head_tokens, "rows": option.rows,
            "step_s": option.step_s, "acceptance": option.acceptance_rate(), "k": option.k,
            "predicted_speedup": option.predicted_speedup, "applies": option.applies, "chosen": option.chosen,
            "measured": option.measured, "best_case": option.best_case, "provisional": option.provisional,
            "rest_share": option.rest_share}


def from_dict(data: dict) -> DraftOption:
    """An option as the tune file keeps it (what `choose` needs: precision, head, predicted speedup)."""
    number = lambda value: math.nan if value is None else float(value)  # noqa: E731 (null: not measured)
    return DraftOption(str(data["precision"]), int(data["head_tokens"]), rows=int(data.get("rows", 0)),
                       step_s=number(data.get("step_s")), k=int(data.get("k", 0)),
                       predicted_speedup=number(data["predicted_speedup"]), chosen=bool(data.get("chosen", False)),
                       measured=bool(data.get("measured", True)), best_case=number(data.get("best_case")),
                       provisional=str(data.get("provisional", "")), rest_share=number(data.get("rest_share", 0.0)))
