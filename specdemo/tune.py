"""Compile settings chosen per machine by measurement: `python -m specdemo tune`.

Which kernels OpenVINO's CPU plugin runs depends on the CPU, so no setting is best everywhere. Its source says why:
dynamic quantization of activations (the fast int8/int4 kernels) needs VNNI and f32 activations, so an AVX2-only CPU
never gets it and the bf16 default the plugin picks on any AVX512_BF16 CPU turns it off; its group size must divide
the weights' own group size (256 does not divide an int4 model's 128, which falls to the slow path); the fused
MLP/QKV paths are AMX-only. So each model is measured here, on this machine, with both models loaded:

* starting from our defaults, one setting at a time is varied over its candidates (dynamic-quantization group size,
  inference precision where the CPU has it, KV-cache precision, threads where there are cores to spare);
* each candidate is compiled and checked for fidelity: its greedy choices, teacher forced over built-in answers
  (assets/calibration.json), must equal the reference compile's (f32, no dynamic quantization) wherever the
  reference is not at a near-tie;
* the faithful ones are timed in the loop's own call pattern (a single step as the autoregressive lane makes it and a
  short and a long round's verify calls for the target; a draft step inside a round for the draft), each raced
  against the incumbent alone, in turns, until two heats agree (specdemo/race.py), and the fastest stays;
* the chosen pair must still give greedy speculative output equal to autoregressive output.

Memory is bounded (specdemo/memory.py): two compiles of a model at a time, each let go before the next, and every
compile waits for room first; a tune memory does not allow ends with memory.Short (exit memory.SKIPPED).

The choice is kept in the machine profile (specdemo/profile: Profile.keep_tune, read by Profile.resolve) and applied
to every compile of these models (ours, GenAI's lane in the page, the bench's GenAI peers), so comparisons stay like
for like; the cost model is measured again under it.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass, replace

import numpy as np

from specdemo import builtin, identity, machine, memory, sources
from specdemo.profile import machine_profile
from specdemo.profile.choices import DEFAULT, REFERENCE, Setting, searched
from specdemo.fidelity import teacher_forced_logits
from specdemo.race import PIECE, race, sample_draft, sample_target
from specdemo.settings import ModelSettings

# 0: dynamic quantization off. 16 divides the groups of 16 a GGUF's Q6_K blocks keep (precision gguf), 32 its Q4_K
# ones; 64 and above divide only NNCF's groups of 128 and per-channel weights.
GROUP_SIZES = (0, 16, 32, 64, 128, 256)
KV_PRECISIONS = ("f32", "f16", "u8")
FAITHFUL = 0.99  # share of the reference's decided (not near-tie) greedy choices a candidate must keep
MARGIN = 0.03  # a candidate replaces the incumbent setting only if it is at least this much faster (noise is not a gain)


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


def candidates(current: Setting, dimension: str, cpu_flags: list[str], cores: int) -> list[Setting]:
    """`current` with one dimension varied over what this CPU offers."""
    if dimension == "dynamic_quantization_group_size":
        values = GROUP_SIZES
    elif dimension == "inference_precision":
        values = ["f32"] + (["bf16"] if {"avx512_bf16", "amx_bf16"} & set(cpu_flags) else []) + \
                 (["f16"] if {"avx512_fp16", "amx_fp16"} & set(cpu_flags) else [])
    elif dimension == "kv_cache_precision":
        values = KV_PRECISIONS
    else:
        values = [0] + ([cores - 1] if cores >= 4 else [])
    return [replace(current, **{dimension: value}) for value in values]


DIMENSIONS = ("dynamic_quantization_group_size", "inference_precision", "kv_cache_precision", "num_threads")
DIMENSION_NAMES = {"dynamic_quantization_group_size": "dynamic-quantization group size",
                   "inference_precision": "inference precision", "kv_cache_precision": "KV-cache precision",
                   "num_threads": "threads"}


@dataclass
class Probe:
    """The reference's greedy choices over one built-in answer, and where it was decided (not at a near-tie)."""

    prompt: list[int]
    text: list[int]
    choices: np.ndarray
    decided: np.ndarray  # bool: the reference's top-2 margin was at least NEAR_TIE_LOGIT_GAP


def probes_of(model, tokenizer, examples: list[dict]) -> list[Probe]:
    """Teacher-forced greedy choices and margins of the reference compile over each example's answer."""
    from specdemo.verification import NEAR_TIE_LOGIT_GAP

    out = []
    for example in examples:
        prompt, text = encode(tokenizer, example)
        logits = teacher_forced_logits(model, prompt, text, PIECE)  # (len - 1, V)
        top2 = np.partition(logits, -2, axis=-1)[:, -2:]
        out.append(Probe(prompt, text, logits.argmax(axis=-1), (top2[:, 1] - top2[:, 0]) >= NEAR_TIE_LOGIT_GAP))
    return out


def encode(tokenizer, example: dict) -> tuple[list[int], list[int]]:
    """A built-in example as (prompt ids with the chat template, answer ids)."""
    chat = tokenizer.apply_chat_template([{"role": "user", "content": example["instruction"]}],
                                         add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(chat, add_special_tokens=False), tokenizer.encode(example["answer"], add_special_tokens=False)


def agreement(model, probes: list[Probe]) -> float:
    """The share of the reference's decided greedy choices this compile makes too."""
    kept = total = 0
    for probe in probes:
        choices = teacher_forced_logits(model, probe.prompt, probe.text, PIECE).argmax(axis=-1)
        kept += int(((choices == probe.choices) & probe.decided).sum())
        total += int(probe.decided.sum())
    return kept / total if total else 1.0


def compile_model(settings: ModelSettings, tokenizer=None, profiled: bool = False):
    """A compile for measuring only: no compiled-model cache (ten variants of a 1.6 GiB model would fill the disk). A
    head size above 0 trims the LM head (needs the `tokenizer`); profiled turns the per-node counters on."""
    from specdemo import vocab
    from specdemo.runtime import OVModel

    folder = sources.prepare(settings)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    head = vocab.head_for(tokenizer, settings.head_tokens, config, sources.specdemo_home() / "vocab")
    return OVModel(folder, settings, head_ids=head, profiled=profiled)


def compiled_in_bound(settings: ModelSettings, what: str, log, tokenizer=None):
    """compile_model once memory allows it (memory.wait_for, which says so when it waits or gives up); else None."""
    if not memory.wait_for(memory.compile_need(sources.weights_bytes(settings)), what, log):
        return None
    return compile_model(settings, tokenizer)


def admitted(settings: ModelSettings, what: str, log, tokenizer=None):
    """compiled_in_bound, or memory.Short when memory does not allow the compile."""
    model = compiled_in_bound(settings, what, log, tokenizer)
    if model is None:
        raise memory.Short(f"memory does not allow {what}; `python -m specdemo tune` tries again")
    return model


def search(role: str, base: ModelSettings, other, probes: list[Probe], log, cpu_flags: list[str], cores: int,
           compile=None, fidelity=None, timer=None, parting=None, admit=None) -> list[Trial]:
    """Coordinate descent over DIMENSIONS from DEFAULT for one model; every trial, the chosen one marked. `compile`,
    `fidelity` and `timer` default to compiling for real, `agreement` and the role's loop-pattern timer; `admit(what)`
    whether memory allows one more compile (for real compiles, memory.wait_for memory.compile_need of `base`).

    Two compiles of the model at a time: in each dimension the incumbent's compile is held while each challenger is
    compiled, checked, raced against it alone (race.race, the two in turns) and let go before the next (a 1.5B INT8
    target holds 1.6 GiB a compile: six at once took 11 GiB). A challenger's time is a ratio to the incumbent's in
    their own race, chained to the defaults through the incumbents, so the drift of a shared machine between races
    cancels; one that beats the incumbent by MARGIN races it again and keeps the smaller of its two gains. A challenger
    memory does not allow is skipped, and the log says so.

    `parting` (model -> fidelity.BatchingNoise, identity.judge), for a target whose greedy lanes must stay identical: a
    setting replaces the incumbent only if its parting rate (single steps against verify calls) is no worse than the
    defaults' beyond their counting noise (identity.parts_no_more); a faster one that parts more often is passed over,
    and the table says so."""
    compile = compile or compile_model
    fidelity = fidelity or agreement
    timer = timer or (lambda models, other: race(models, other, sample_target if role == "target" else sample_draft))
    if admit is None:  # real compiles wait for memory; stand-ins take none
        need = memory.compile_need(sources.weights_bytes(base))
        admit = (lambda what: memory.wait_for(need, what, log)) if compile is compile_model else (lambda what: True)

    def compiled(trial: Trial):
        """The trial's compile, or None when memory does not allow it."""
        return compile(trial.setting.apply(base)) if admit(f"compiling the {role} at {trial.setting.describe()}") else None

    trials: list[Trial] = []
    best = Trial(role, DEFAULT)
    baseline = None  # the defaults' trial, once its parting rate is measured
    for dimension in DIMENSIONS:
        known = {t.setting: t for t in trials}  # fidelity and parting rate are measured once per setting
        options = [_carried(Trial(role, s), known.get(s)) for s in candidates(best.setting, dimension, cpu_flags, cores)]
        if len(options) < 2:
            continue
        log(f"{role}: {DIMENSION_NAMES[dimension]}, {len(options)} settings, each raced against {best.setting.describe()}")
        pace, held, ratio = None, None, {}  # the faithful trial the others race against, its compile, their ratios to it
        for trial in sorted(options, key=lambda t: t.setting != best.setting):  # the incumbent first
            model = compiled(trial)
            if model is None:
                if trial.setting == best.setting:
                    raise memory.Short(f"memory does not allow the {role}'s incumbent compile, which every other one "
                                       "races; `python -m specdemo tune` tries again")
                continue
            if trial.agreement != trial.agreement:
                trial.agreement = fidelity(model, probes)
                log(f"  {role} {trial.setting.describe()}: keeps {trial.agreement:.1%} of the reference's greedy choices")
            trial.faithful = trial.agreement >= FAITHFUL
            if trial.faithful and pace is None:
                pace, held, ratio[id(trial)] = trial, model, 1.0
            elif trial.faithful:
                pace.seconds, trial.seconds = timer([held, model], other)
                ratio[id(trial)] = trial.seconds / pace.seconds
                if ratio[id(trial)] < 1 - MARGIN:  # a gain must hold in a second race too: one race can be unlucky
                    pace_s, seconds = timer([held, model], other)
                    ratio[id(trial)] = max(ratio[id(trial)], seconds / pace_s)
            del model  # the held one stays in `held`
            gc.collect()
        if pace is not None and len(ratio) == 1:  # raced against no one: timed alone
            pace.seconds = timer([held], other)[0]
        incumbent = pace if pace is not None and pace.setting == best.setting else None
        scale = best.relative if best.relative == best.relative else 1.0
        for trial in (t for t in options if id(t) in ratio):
            trial.relative = scale * ratio[id(trial)] if incumbent else float("nan")
            log(f"  {role} {trial.setting.describe()}: {trial.seconds * 1e3:.1f} ms ({trial.relative:.2f}× the defaults)")
        trials = [t for t in trials if all(t.setting != o.setting for o in options)] + options  # the latest timing of each
        faster = sorted((t for t in options if id(t) in ratio and (incumbent is None or ratio[id(t)] < 1 - MARGIN)),
                        key=lambda t: ratio[id(t)])
        if parting is not None and faster:
            judge = lambda t: identity.measured(t, held if t is pace else None, compiled, parting, log)  # noqa: E731
            if baseline is None:
                baseline = next((t for t in options if id(t) in ratio and t.setting == DEFAULT), incumbent)
                if baseline is not None:
                    judge(baseline)
            # fastest first, judged one at a time until one parts no more often than the defaults (~1 min each)
            faster = next(([t] for t in faster if judge(t) and identity.parts_no_more(t, baseline)), [])
        del held
        gc.collect()
        if faster:
            best = faster[0]
        elif incumbent is not None:
            best = incumbent
    for trial in trials:
        trial.chosen = trial.setting == best.setting
    return trials


def _carried(trial: Trial, earlier: Trial | None) -> Trial:
    """A new trial of a setting, with what an earlier dimension measured of it that does not drift (fidelity, parting)."""
    if earlier is not None:
        trial.agreement, trial.parting_rate, trial.parting_positions = \
            earlier.agreement, earlier.parting_rate, earlier.parting_positions
    return trial


def tune(target: ModelSettings, draft: ModelSettings, log=print, again: bool = True) -> tuple[list[Trial], list]:
    """Choose each model's compile setting on this machine (see the module's docstring), then the draft's head size
    (specdemo/draft_choice.py); returns the trials and the draft options.

    With `again` False, a draft this machine has a setting and a plan for is not searched again: only the target is
    (another configuration's target beside the same draft, e.g. the fastest configuration's INT4), against the draft
    as tuned, and the options come back empty (the plan stays as it was)."""
    from transformers import AutoTokenizer

    examples = builtin.code_answers()
    flags, cores = machine.cpu_features() + _extra_flags(), machine.usable_cores()
    tokenizer = AutoTokenizer.from_pretrained(sources.prepare(target))
    profile = machine_profile()
    draft_done = not again and profile.chosen(searched(draft)) is not None and not profile.needs_plan(draft)
    roles = [("target", target, searched(draft))] + ([] if draft_done else [("draft", searched(draft), target)])
    trials = []
    other = None
    for role, base, partner in roles:
        other = None  # the previous partner's compile goes before the next one loads
        gc.collect()
        log(f"{role}: the reference (f32, no dynamic quantization), for fidelity")
        reference = admitted(REFERENCE.apply(base), f"the {role}'s reference compile", log)
        probes = probes_of(reference, tokenizer, examples)
        del reference
        gc.collect()
        if role == "draft":
            other = admitted(tune_choice(trials, "target", target), "the tuned target, beside the draft", log)
        else:  # the target is timed beside the draft as this machine runs it: tuned if it is, else the defaults
            # The draft as this machine runs it, its LM head trimmed where the plan chose so (the tokenizer says how).
            other = admitted(profile.resolve(draft) if draft_done else DEFAULT.apply(partner), "the draft, beside the target",
                             log, tokenizer)
        judge = identity.judge([encode(tokenizer, e) for e in identity.examples(examples)]) \
            if role == "target" and identity.keeps_identity(target) else None
        trials += search(role, base, other, probes, log, flags, cores, parting=judge)
    if draft_done:
        log("draft: tuned and planned already on this machine; kept as it is")
        return trials, []
    # The draft's search ran against the tuned target: the draft plan measures against that compile too.
    return trials, plan_draft(tune_choice(trials, "draft"), other, draft, tokenizer, examples, log)


def plan_draft(setting: Setting, target, draft: ModelSettings, tokenizer, examples: list[dict], log) -> list:
    """The draft plan under the draft's compile `setting`: each candidate draft measured against `target` (the tuned
    target's runtime) and priced by the planner on the target's cost curve, measured here (draft_choice)."""
    from specdemo import draft_choice, measuring
    from specdemo.settings import K_MAX

    log("draft plan: each candidate draft's acceptance on the built-in answers and its step in a round, priced by the "
        "planner")
    options, incumbent = draft_choice.measure(
        target, draft, examples, lambda example: encode(tokenizer, example), sources.is_prepared,
        lambda settings: compiled_in_bound(setting.apply(settings), f"compiling the draft {settings.precision}, head "
                                           f"{settings.head_tokens or 'full'}", log, tokenizer),
        lambda models, other: race(models, other, sample_draft), log)
    log("  the target's cost curve, for pricing")
    curve = measuring.measure(target, incumbent, K_MAX + 1)
    best = draft_choice.price(options, curve, draft.precision)
    log(f"  draft plan: {best.describe()} (predicted {best.predicted_speedup:.2f}× at K = {best.k})")
    return options


def replan_draft(target: ModelSettings, draft: ModelSettings, log=print) -> list:
    """The draft plan alone, under the compile settings tune already chose (`tune --draft-plan`, ~2 min): for a draft
    whose other precision was prepared after the tune, or a tune file from before the plan covered precisions."""
    from transformers import AutoTokenizer

    examples = builtin.code_answers()
    tokenizer = AutoTokenizer.from_pretrained(sources.prepare(target))
    profile = machine_profile()
    tuned_target = admitted(profile.resolve(target), "the tuned target, for the draft plan", log)
    return plan_draft(profile.chosen(searched(draft)) or DEFAULT, tuned_target, draft, tokenizer, examples, log)


def tune_choice(trials: list[Trial], role: str, base: ModelSettings | None = None):
    """The chosen setting of `role` among `trials`, applied to `base` when given."""
    best = next(t for t in trials if t.role == role and t.chosen)
    return best.setting.apply(base) if base is not None else best.setting


def check_exact(engine, examples: list[dict], tokens: int = 48) -> str:
    """"" when greedy speculative output equals autoregressive output on the examples under the engine's compile
    settings (a difference allowed only where both lanes saw a near-tie, as the tests allow); else a sentence."""
    from specdemo.lane import drain
    from specdemo.settings import GenerationSettings, KPolicy
    from specdemo.verification import NEAR_TIE_LOGIT_GAP

    settings = GenerationSettings(max_new_tokens=tokens, k_policy=KPolicy.fixed(4))
    for example in examples:
        ar = drain(engine.autoregressive(example["instruction"], settings))
        spec = drain(engine.speculative(example["instruction"], settings))
        i = next((j for j, (a, b) in enumerate(zip(ar.ids, spec.ids)) if a != b), None)
        if i is not None and max(ar.tokens[i].margin, spec.tokens[i].margin) >= NEAR_TIE_LOGIT_GAP:
            return f"speculative output parts from autoregressive output at token {i + 1} of {example['instruction']!r}"
    return ""


def _extra_flags() -> list[str]:
    """Flags tune asks about beyond machine.cpu_features (f16 arithmetic)."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return []
    return [f for f in ("avx512_fp16", "amx_fp16") if f in flags]
