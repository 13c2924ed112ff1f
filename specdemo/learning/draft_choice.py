"""Which draft to run on this machine: its LM-head size and weight precision, chosen by predicted speedup.

A draft is only worth what it buys: a cheaper draft step (an LM head trimmed to the most frequent tokens, or other
weights) pays only if the acceptance it loses costs less. Which side wins depends on the CPU: where a draft step
costs half a target step (an AVX2-only CPU) a 15 % cheaper step is worth a lot; where it costs a quarter (AMX), the
same step saved is worth little and the lost acceptance decides. So `python -m specdemo tune` measures each candidate
draft here, with the tuned target loaded:

* its draft step, as a round makes it (race.sample_draft), raced against the incumbent draft (race.race: until the
  ratio of their steps is clear of MARGIN, or a cap), two drafts at a time;
* its acceptance by draft position, exactly, on the built-in answers (assets/calibration.json): where its greedy token
  equals the target's, teacher forced (counterfactual.greedy_choices; the target's choices computed once);

and prices each with the planner (the target's measured cost curve, the draft's calls scaled by the candidate's step
time): the predicted speedup at its best K. The configured draft (its precision, the full head) stays unless another
is predicted at least MARGIN faster. Every candidate is lossless: the target checks every token.

A draft whose precision is left to the plan (`auto`, the default draft's) gets the chosen option, precision and head
(Profile.resolve), among the precisions prepared here; a draft with an explicit precision gets the best head of that
precision by the same rule, and a head given explicitly is kept. Another precision is priced only when its IR is
already prepared (the page's background work prepares the default draft's INT8 before it tunes).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field, replace

from specdemo.decoding import planner
from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import MASKED, strategy
from specdemo.decoding.planner import Acceptance
from specdemo.host import memory
from specdemo.settings import AUTO, DRAFT_PRECISION, K_MAX, ModelSettings

HEADS = (0, 32_000, 16_000, 8_000)  # LM-head sizes tried (0: the full vocabulary)
PRECISIONS = ("int4", "int8")  # draft weight precisions priced when prepared
MARGIN = 0.03  # another draft replaces the configured one only if predicted at least this much faster


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

    def describe(self) -> str:
        head = "full head" if not self.head_tokens else f"head {self.head_tokens // 1000}k"
        return f"{self.precision}, {head}"

    def acceptance(self) -> Acceptance:
        return Acceptance.from_counts(self.tested, self.accepted, Acceptance.geometric(strategy(MASKED).planning.default_alpha))

    def acceptance_rate(self) -> float:
        """Accepted ÷ tested over every position: one number for the table."""
        return sum(self.accepted) / sum(self.tested) if sum(self.tested) else math.nan


def candidates(draft: ModelSettings, prepared) -> list[ModelSettings]:
    """The configured draft (an auto precision: DRAFT_PRECISION) with the full head first (the incumbent), then trimmed
    heads, then the other precisions whose IR `prepared(settings)` says is ready (converting one would take minutes of
    a user's first day)."""
    if draft.precision == AUTO:
        draft = replace(draft, precision=DRAFT_PRECISION)
    out = [replace(draft, head_tokens=h) for h in HEADS]
    out += [replace(draft, precision=p, head_tokens=0) for p in PRECISIONS if p != draft.precision
            and prepared(replace(draft, precision=p, head_tokens=0))]
    return out


def price(options: list[DraftOption], costs: CostModel, precision: str = AUTO, k_max: int = K_MAX) -> DraftOption:
    """Each option's best K and predicted speedup on this machine, and the one a draft of `precision` runs (marked).
    `costs` is the target's curve with the first option's draft; the others' draft calls are scaled by their step over
    its step, both taken in the same race."""
    base = options[0]
    for option in options:
        scale = option.step_s / base.step_s
        scaled = replace(costs, draft_s=tuple(d * scale for d in costs.draft_s))
        option.k, option.predicted_speedup = planner.best_k(scaled, option.acceptance(), k_max)
    best = choose(options, precision)
    best.chosen = True
    return best


def choose(options: list[DraftOption], precision: str = AUTO, head_tokens: int = -1) -> DraftOption | None:
    """Which priced option a draft runs: among those its precision and head allow (auto, -1: any), the first (the
    incumbent: the configured precision's full head, as `candidates` orders them) unless another is predicted at least
    MARGIN faster, then the fastest. None when no option fits."""
    pool = [o for o in options if precision in (AUTO, o.precision) and head_tokens in (-1, o.head_tokens)]
    if not pool:
        return None
    base = best = pool[0]
    for option in pool[1:]:
        if option.predicted_speedup >= (1 + MARGIN) * max(base.predicted_speedup, 1.0) \
                and option.predicted_speedup > best.predicted_speedup:
            best = option
    return best


def measure(target, draft: ModelSettings, examples: list[dict], encode, prepared, compile, timer, alone, log,
            incumbent=None) -> tuple[list[DraftOption], object]:
    """Every candidate's acceptance on the examples and its draft step in a round, against `target` (a runtime), and
    the incumbent's compiled draft (for the cost curve `price` needs). `encode(example)` gives (prompt ids, answer
    ids); `compile(settings)` a draft runtime, or None when memory does not allow one (the candidate is left out;
    the incumbent cannot be: memory.Short); `timer(incumbent, challenger, target)` a race.Verdict of a draft step in a
    round (race.race over race.sample_draft), `alone(model, target)` a step's seconds when there is no one to race;
    `incumbent`: the first candidate's compile, when the caller holds it already.

    Two drafts at a time beside the target: the incumbent's compile is held while each other candidate is compiled,
    measured, raced against it alone and let go. A candidate's step is the incumbent's first time scaled by their ratio
    in its own race, so the machine's drift between races cancels in what `price` reads (steps over the incumbent's).
    The target's greedy choices on the examples are computed once and compared with each candidate's."""
    from specdemo.results.counterfactual import greedy_choices, mask_counts

    texts = [encode(example) for example in examples]
    theirs = [greedy_choices(target, prompt, text) for prompt, text in texts]
    options, held = [], None
    for settings in candidates(draft, prepared):
        model = incumbent if held is None and incumbent is not None else compile(settings)
        if model is None:
            if held is None:
                raise memory.Short("memory does not allow the draft plan's incumbent draft; `python -m specdemo tune "
                                   "--draft-plan` tries again")
            continue
        option = DraftOption(settings.precision, settings.head_tokens, rows=model.head_tokens,
                             applies=draft.precision in (AUTO, settings.precision))
        option.tested, option.accepted = [0] * K_MAX, [0] * K_MAX
        for (prompt, text), target_choices in zip(texts, theirs):
            mask = [1] + [int(x) for x in greedy_choices(model, prompt, text) == target_choices]
            tested, accepted = mask_counts(mask, K_MAX)
            option.tested = [a + b for a, b in zip(option.tested, tested)]
            option.accepted = [a + b for a, b in zip(option.accepted, accepted)]
        log(f"  draft {option.describe()} ({option.rows:,} rows): agrees with the target on "
            f"{option.acceptance_rate():.1%} of tested drafts")
        options.append(option)
        if held is None:
            held = model
            continue
        verdict = timer(held, model, target)
        if options[0].step_s != options[0].step_s:
            options[0].step_s = verdict.incumbent_s
        option.step_s = options[0].step_s * verdict.ratio
        del model
        gc.collect()
    if len(options) == 1:  # raced against no one: timed alone
        options[0].step_s = alone(held, target)
    return options, held


def table(options: list[DraftOption]) -> list[str]:
    """The draft plan as printed by `tune`."""
    lines = [f"{'draft':22}{'head rows':>11}{'step':>10}{'accepted':>10}{'best K':>8}{'predicted':>11}"]
    for o in options:
        mark = "  <- chosen" if o.chosen else ("" if o.applies else "  (another precision: --draft-precision auto may take it)")
        lines.append(f"{o.describe():22}{o.rows:>11,}{o.step_s * 1e3:>7.1f} ms{o.acceptance_rate():>10.1%}{o.k:>8}"
                     f"{o.predicted_speedup:>10.2f}×{mark}")
    return lines


def to_dict(option: DraftOption) -> dict:
    return {"precision": option.precision, "head_tokens": option.head_tokens, "rows": option.rows,
            "step_s": option.step_s, "acceptance": option.acceptance_rate(), "k": option.k,
            "predicted_speedup": option.predicted_speedup, "applies": option.applies, "chosen": option.chosen}


def from_dict(data: dict) -> DraftOption:
    """An option as the tune file keeps it (what `choose` needs: precision, head, predicted speedup)."""
    number = lambda value: math.nan if value is None else float(value)  # noqa: E731 (null: not measured)
    return DraftOption(str(data["precision"]), int(data["head_tokens"]), rows=int(data.get("rows", 0)),
                       step_s=number(data.get("step_s")), k=int(data.get("k", 0)),
                       predicted_speedup=number(data["predicted_speedup"]), chosen=bool(data.get("chosen", False)))
