"""Compile settings chosen per machine by measurement: `python -m specdemo tune`.

No setting is best everywhere, and most cannot win on a given CPU class at all: tune races, from our defaults and
one setting at a time, only the challengers that can win here (specdemo/learning/candidates.py says which and why):

* each challenger is compiled and checked for fidelity: its greedy choices, teacher forced over built-in answers
  (assets/calibration.json), must equal the reference compile's (f32, no dynamic quantization) wherever the
  reference is not at a near-tie;
* a faithful one races the incumbent in the loop's own call pattern (specdemo/learning/race.py: a sequential test on paired
  samples that stops once the leader is clear) and replaces it only when clearly MARGIN faster; groups are tried
  largest first, and the first that is not faster ends its dimension (a smaller group does more work per row);
* the chosen pair must still give greedy speculative output equal to autoregressive output (specdemo/run/exactness.py,
  asked by the tune command).

Every compile goes through OpenVINO's compiled-model cache (SPECDEMO_HOME/ov_cache, the page's): the CPU plugin's
blob holds the graph, and the settings tune varies (group, precision, KV cache, threads) are applied as it is
imported, so one blob serves every candidate (checked: the same logits as a fresh compile). An import is faster and
holds 0.7 GiB less than a fresh compile of the 1.5B target (the graph's fused weights stay in the blob). The incumbent's
compile is held across dimensions and a winner's is kept, so no setting is compiled twice.

Memory is bounded (specdemo/host/memory.py): the tune waits for room for its whole peak (memory.tune_need) before it
compiles anything, then holds at most two compiles of a model (the incumbent and one challenger) beside the other
model, each admitted before it is compiled; a tune memory does not allow ends with memory.Short (exit memory.SKIPPED).

The choice is kept in the machine profile (specdemo/learning/profile: Profile.keep_tune, read by Profile.resolve) and applied
to every compile of these models (ours, GenAI's lane in the page, the bench's GenAI peers), so comparisons stay like
for like; the cost model is measured again under it.
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from specdemo.learning import builtin, identity
from specdemo.learning.candidates import CPU, DIMENSION_NAMES, DIMENSIONS, Layout, challengers, nothing_to_race
from specdemo.models import sources
from specdemo.models.chat import encode_example
from specdemo.host import memory
from specdemo.results.fidelity import teacher_forced_logits
from specdemo.learning.profile import machine_profile
from specdemo.learning.profile.choices import DEFAULT, REFERENCE, Setting, searched
from specdemo.learning.race import PIECE, alone, race, sample_draft, sample_target
from specdemo.settings import ModelSettings

FAITHFUL = 0.99  # share of the reference's decided (not near-tie) greedy choices a candidate must keep


@dataclass
class Trial:
    """One candidate setting of one model, as tune found it."""

    role: str  # "target" or "draft"
    setting: Setting
    seconds: float = float("nan")  # the score: target t(1) + its verify calls' (race.VERIFY_SIZES); draft: a step in a round
    relative: float = float("nan")  # its score over the defaults', chained through the races it and they ran in
    agreement: float = float("nan")  # share of the reference's decided greedy choices kept
    parting_rate: float = float("nan")  # per 1,000 positions: verify calls choosing another token than single steps
    parting_positions: int = 0  # the positions that rate was counted over
    faithful: bool = False
    chosen: bool = False


@dataclass
class Probe:
    """The reference's greedy choices over one built-in answer, and where it was decided (not at a near-tie)."""

    prompt: list[int]
    text: list[int]
    choices: np.ndarray
    decided: np.ndarray  # bool: the reference's top-2 margin was at least NEAR_TIE_LOGIT_GAP


def probes_of(model, tokenizer, examples: list[dict]) -> list[Probe]:
    """Teacher-forced greedy choices and margins of the reference compile over each example's answer."""
    from specdemo.decoding.verification import NEAR_TIE_LOGIT_GAP

    out = []
    for example in examples:
        prompt, text = encode_example(tokenizer, example)
        logits = teacher_forced_logits(model, prompt, text, PIECE)  # (len - 1, V)
        top2 = np.partition(logits, -2, axis=-1)[:, -2:]
        out.append(Probe(prompt, text, logits.argmax(axis=-1), (top2[:, 1] - top2[:, 0]) >= NEAR_TIE_LOGIT_GAP))
    return out


def agreement(model, probes: list[Probe]) -> float:
    """The share of the reference's decided greedy choices this compile makes too."""
    kept = total = 0
    for probe in probes:
        choices = teacher_forced_logits(model, probe.prompt, probe.text, PIECE).argmax(axis=-1)
        kept += int(((choices == probe.choices) & probe.decided).sum())
        total += int(probe.decided.sum())
    return kept / total if total else 1.0


def compile_model(settings: ModelSettings, tokenizer=None, profiled: bool = False):
    """A compile for measuring. The full head goes through the compiled-model cache the page's compiles use (one blob
    per graph serves every setting tune varies); a head size above 0 trims the LM head (needs the `tokenizer`), a
    graph compiled once here, without the cache; profiled turns the per-node counters on."""
    from specdemo.models import vocab
    from specdemo.models.runtime import OVModel

    folder = sources.prepare(settings)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    head = vocab.head_for(tokenizer, settings.head_tokens, config, sources.specdemo_home() / "vocab")
    cache = sources.specdemo_home() / "ov_cache" if head is None else None
    return OVModel(folder, settings, cache_dir=cache, head_ids=head, profiled=profiled)


def compiled_in_bound(settings: ModelSettings, what: str, log, tokenizer=None, fresh: bool = False):
    """compile_model once memory allows it (memory.wait_for, which says so when it waits or gives up); else None.
    `fresh`: the first compile of its graph, which holds more than an import of its blob (memory.compile_need)."""
    if not memory.wait_for(memory.compile_need(sources.weights_bytes(settings), fresh), what, log):
        return None
    return compile_model(settings, tokenizer)


def admitted(settings: ModelSettings, what: str, log, tokenizer=None, fresh: bool = False):
    """compiled_in_bound, or memory.Short when memory does not allow the compile."""
    model = compiled_in_bound(settings, what, log, tokenizer, fresh)
    if model is None:
        raise memory.Short(f"memory does not allow {what}; `python -m specdemo tune` tries again")
    return model


@dataclass
class Search:
    """Coordinate descent over DIMENSIONS from DEFAULT for one model, racing only `challengers` (run); its services are
    fields, real by default (a test hands in stand-ins).

    Two compiles of the model at a time: the incumbent's is held from dimension to dimension; each challenger is
    compiled, checked, raced against it and let go unless it wins (a 1.5B target holds 1.6 GiB a compile: six at once
    took 11 GiB). A challenger's time is a ratio to the incumbent's in their own race, chained to the defaults through
    the incumbents, so a shared machine's drift between races cancels; one memory does not allow is skipped, and said.
    With `parting` (a target whose greedy lanes must stay identical) a winner must also part (single steps against
    verify calls) no more often than the defaults beyond their counting noise (identity.parts_no_more), measured on its
    own compile while it is held; a faster one that parts more often is passed over, and the table says so."""

    role: str  # "target" or "draft"
    base: ModelSettings  # the model as configured: each setting is applied to it
    other: object  # the other model's compile, run beside this one in each race
    probes: list[Probe]  # the reference compile's greedy choices, for fidelity
    log: Callable[[str], None]
    compile: Callable = compile_model  # ModelSettings -> a compile
    fidelity: Callable = agreement  # (compile, probes) -> the share of the reference's decided greedy choices it keeps
    timer: Callable | None = None  # (incumbent, challenger, other) -> race.Verdict; None: the role's race
    parting: Callable | None = None  # compile -> (fidelity.BatchingNoise, identity.judge); None: not judged
    admit: Callable | None = None  # what -> whether memory allows one more compile; None: memory.wait_for for real
    #                                compiles (memory.compile_need of `base`), always for stand-ins

    def __post_init__(self):
        sample = sample_target if self.role == "target" else sample_draft
        self.timer = self.timer or (lambda incumbent, challenger, other: race(incumbent, challenger, other, sample))
        if self.admit is None:  # real compiles wait for memory; stand-ins take none
            real = self.compile is compile_model
            need = memory.compile_need(sources.weights_bytes(self.base)) if real else 0
            self.admit = lambda what: not real or memory.wait_for(need, what, self.log)

    def run(self, cpu: CPU, layout: Layout) -> tuple[list[Trial], object]:
        """Every trial on this CPU class and weights' `layout` (the chosen one marked), and the chosen setting's compile
        (None when nothing was raced)."""
        best, held = Trial(self.role, DEFAULT, relative=1.0), None  # the incumbent and its compile
        trials, defaults = [best], best
        for dimension in DIMENSIONS:
            options = [Trial(self.role, s) for s in challengers(best.setting, dimension, cpu, layout)]
            if not options:
                continue
            held = self.incumbent(best) if held is None else held
            self.log(f"{self.role}: {DIMENSION_NAMES[dimension]}, {len(options)} settings, each raced against "
                     f"{best.setting.describe()}")
            for trial in options:
                trials.append(trial)
                model = self.compiled(trial)
                if model is None:
                    continue
                if self.faithful(trial, model) and self.beats(trial, model, best, held, defaults):
                    best, held = trial, model
                    break
                del model
                gc.collect()
                # A smaller group is more faithful, so an unfaithful one tries the next; but a smaller group does more
                # work a row, so one that lost the race ends the dimension.
                if trial.faithful and dimension == "dynamic_quantization_group_size":
                    break
        for trial in trials:
            trial.chosen = trial is best
        return trials, held

    def compiled(self, trial: Trial):
        """The trial's compile, or None when memory does not allow it."""
        what = f"compiling the {self.role} at {trial.setting.describe()}"
        return self.compile(trial.setting.apply(self.base)) if self.admit(what) else None

    def incumbent(self, trial: Trial):
        """The defaults' compile, checked, which every challenger races; memory.Short where memory does not allow it."""
        model = self.compiled(trial)
        if model is None:
            raise memory.Short(f"memory does not allow the {self.role}'s incumbent compile, which every other one "
                               "races; `python -m specdemo tune` tries again")
        self.faithful(trial, model)
        return model

    def faithful(self, trial: Trial, model) -> bool:
        """Whether the trial keeps FAITHFUL of the reference's decided choices (measured once a trial)."""
        if trial.agreement != trial.agreement:
            trial.agreement = self.fidelity(model, self.probes)
            self.log(f"  {self.role} {trial.setting.describe()}: keeps {trial.agreement:.1%} of the reference's "
                     "greedy choices")
        trial.faithful = trial.agreement >= FAITHFUL
        return trial.faithful

    def beats(self, trial: Trial, model, best: Trial, held, defaults: Trial) -> bool:
        """Race the trial's compile against the incumbent's (`best`, its compile `held`) and say whether it replaces it:
        clearly faster, or the incumbent unfaithful; and, with `parting`, parting no more often than `defaults`."""
        verdict = self.timer(held, model, self.other)
        best.seconds, trial.seconds = verdict.incumbent_s, verdict.challenger_s
        trial.relative = best.relative * verdict.ratio
        self.log(f"  {self.role} {trial.setting.describe()}: {trial.seconds * 1e3:.1f} ms, {verdict.ratio:.2f}× the "
                 f"incumbent ({verdict.low:.2f}–{verdict.high:.2f}, {verdict.pairs} pairs; {trial.relative:.2f}× the "
                 "defaults)" + (f"; {verdict.busy}" if verdict.busy else ""))
        wins = verdict.faster or not best.faithful
        if wins and self.parting is not None:  # the defaults' rate only where the challenger's does not settle it
            wins = identity.measured(trial, model, self.compiled, self.parting, self.log) and (
                identity.parts_no_more(trial, None) or
                identity.measured(defaults, held if best is defaults else None, self.compiled, self.parting, self.log)
                and identity.parts_no_more(trial, defaults))
        return wins


def tune(target: ModelSettings, draft: ModelSettings, log=print, again: bool = True) -> tuple[list[Trial], list]:
    """Choose each model's compile setting on this machine (see the module's docstring), then the draft's head size
    (specdemo/learning/draft_choice.py); returns the trials and the draft options.

    With `again` False, a draft this machine has a setting and a plan for is not searched again: only the target is
    (another configuration's target beside the same draft, e.g. the fastest configuration's INT4), against the draft
    as tuned, and the options come back empty (the plan stays as it was)."""
    from transformers import AutoTokenizer

    examples = builtin.code_answers()
    cpu = CPU.here()
    tokenizer = AutoTokenizer.from_pretrained(sources.prepare(target))
    profile = machine_profile()
    draft_done = not again and profile.chosen(searched(draft)) is not None and not profile.needs_plan(draft)
    drafted = profile.resolve(draft) if draft_done else DEFAULT.apply(searched(draft))
    wait_for_peak(target, drafted, log)
    log(f"this CPU: {cpu.describe()} ({', '.join(sorted(cpu.flags)) or 'no notable flags'}), {cpu.cores} cores")
    roles = [("target", target)] + ([] if draft_done else [("draft", searched(draft))])
    trials, kept = [], {}  # kept: each role's chosen compile, while it is worth holding
    for role, base in roles:
        layout = Layout.of(sources.prepare(base))
        if nothing_to_race(cpu, layout):
            log(f"{role}: nothing can beat the defaults on this CPU (dynamic quantization needs VNNI, bf16 and f16 AMX, "
                "a KV-cache precision a longer context, threads more cores): kept without a race")
            trials.append(Trial(role, DEFAULT, relative=1.0, faithful=True, chosen=True))
            continue
        log(f"{role}: the reference (f32, no dynamic quantization), for fidelity")
        reference = admitted(REFERENCE.apply(base), f"the {role}'s reference compile", log, fresh=True)
        probes = probes_of(reference, tokenizer, examples)
        del reference
        gc.collect()
        if role == "draft":
            other = kept.get("target") or admitted(tune_choice(trials, "target", target), "the tuned target, beside the "
                                                                                          "draft", log)
        else:  # the target is timed beside the draft as this machine runs it: tuned if it is, else the defaults
            # The draft as this machine runs it, its LM head trimmed where the plan chose so (the tokenizer says how).
            other = admitted(drafted, "the draft, beside the target", log, tokenizer, fresh=drafted.head_tokens > 0)
        judge = identity.judge([encode_example(tokenizer, e) for e in identity.examples(examples)]) \
            if role == "target" and identity.keeps_identity(target) else None
        found, kept[role] = Search(role, base, other, probes, log, parting=judge).run(cpu, layout)
        trials += found
        del other
        gc.collect()
    if draft_done:
        log("draft: tuned and planned already on this machine; kept as it is")
        return trials, []
    # The draft plan measures against the tuned target, its incumbent the draft as tuned.
    target_model = kept.pop("target", None) or admitted(tune_choice(trials, "target", target), "the tuned target, for "
                                                                                                "the draft plan", log)
    return trials, plan_draft(tune_choice(trials, "draft"), target_model, draft, tokenizer, log,
                              incumbent=kept.pop("draft", None))


def wait_for_peak(target: ModelSettings, draft: ModelSettings, log) -> None:
    """Wait for room for the tune's whole peak (memory.tune_need) beside the rest of the app, what this process holds
    already counted as its own, so that no tune starts that memory would stop halfway; memory.Short if there is none."""
    need = memory.tune_need(sources.weights_bytes(target), sources.weights_bytes(draft))
    if not memory.wait_for(need - memory.anonymous(os.getpid()), "the tune", log):
        raise memory.Short(f"memory does not allow the tune (about {memory.gib(need)} at its peak); `python -m "
                           "specdemo tune` tries again")


def plan_draft(setting: Setting, target, draft: ModelSettings, tokenizer, log, incumbent=None) -> list:
    """The draft plan under the draft's compile `setting`: the target's cost curve with the incumbent draft first
    (quick, or as this machine's profile knows it), then each candidate draft that could change the plan measured
    against `target` (the tuned target's runtime) and priced by the planner on that curve (draft_choice);
    `incumbent`: the configured draft's compile at `setting`, if held."""
    from specdemo.learning import draft_choice, measuring
    from specdemo.settings import K_MAX

    def compile(settings: ModelSettings):
        return compiled_in_bound(setting.apply(settings), f"compiling the draft {settings.precision}, head "
                                 f"{settings.head_tokens or 'full'}", log, tokenizer, fresh=True)

    first = draft_choice.candidates(draft, sources.is_prepared)[0]
    incumbent = incumbent or compile(first)
    if incumbent is None:
        raise memory.Short("memory does not allow the draft plan's incumbent draft; `python -m specdemo tune "
                           "--draft-plan` tries again")
    log("draft plan: the target's cost curve with the incumbent draft; then each candidate draft that could change the "
        "plan on it, its acceptance on the built-in answers and its step in a round")
    # Quick (a few call sizes): pricing needs the curve's shape; the chosen pair's curve is measured in full after.
    known = machine_profile().costs(measuring.cost_key(measuring.describe_key(target, incumbent, K_MAX + 1)))
    curve = measuring.measure(target, incumbent, K_MAX + 1, known, log=log, quick=True)
    config = incumbent.folder / "config.json"
    share = draft_choice.head_share(json.loads(config.read_text()) if config.is_file() else {})
    options, incumbent = draft_choice.measure(
        target, draft, builtin.draft_plan_answers(), lambda example: encode_example(tokenizer, example),
        sources.is_prepared, compile,
        lambda a, b, other: race(a, b, other, sample_draft, measuring=True),
        lambda model, other: alone(model, other, sample_draft), log, incumbent, curve, share)
    best = draft_choice.price(options, curve, draft.precision)
    if skipped := draft_choice.left_out(options):
        log(f"  {skipped}")
    log(f"  {draft_choice.said(best)}")
    return options


def replan_draft(target: ModelSettings, draft: ModelSettings, log=print) -> list:
    """The draft plan alone, under the compile settings tune already chose (`tune --draft-plan`, ~2 min): for a draft
    whose other precision was prepared after the tune, or a tune file from before the plan covered precisions."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(sources.prepare(target))
    profile = machine_profile()
    wait_for_peak(target, DEFAULT.apply(searched(draft)), log)
    tuned_target = admitted(profile.resolve(target), "the tuned target, for the draft plan", log)
    return plan_draft(profile.chosen(searched(draft)) or DEFAULT, tuned_target, draft, tokenizer, log)


def tune_choice(trials: list[Trial], role: str, base: ModelSettings | None = None):
    """The chosen setting of `role` among `trials`, applied to `base` when given."""
    best = next(t for t in trials if t.role == role and t.chosen)
    return best.setting.apply(base) if base is not None else best.setting
