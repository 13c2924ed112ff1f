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
  short and a long round's verify calls for the target; a draft step inside a round for the draft), in two passes in opposite orders,
  and the fastest stays; a third pass settles a ranking the two passes disagree on (specdemo/race.py);
* the chosen pair must still give greedy speculative output equal to autoregressive output.

The choice is kept in the machine profile (specdemo/profile: Profile.keep_tune, read by Profile.resolve) and applied
to every compile of these models (ours, GenAI's lane in the page, the bench's GenAI peers), so comparisons stay like
for like; the cost model is measured again under it.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass, replace

import numpy as np

from specdemo import builtin, machine, sources
from specdemo.profile import machine_profile
from specdemo.profile.choices import DEFAULT, REFERENCE, Setting, searched
from specdemo.fidelity import teacher_forced_logits
from specdemo.race import race, sample_draft, sample_target
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
        logits = teacher_forced_logits(model, prompt, text)  # (len - 1, V)
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
        choices = teacher_forced_logits(model, probe.prompt, probe.text).argmax(axis=-1)
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


def search(role: str, base: ModelSettings, other, probes: list[Probe], log, cpu_flags: list[str], cores: int,
           compile=None, fidelity=None, timer=None, identity=None) -> list[Trial]:
    """Coordinate descent over DIMENSIONS from DEFAULT for one model; every trial, the chosen one marked. `compile`,
    `fidelity` and `timer` default to compiling for real, `agreement` and the role's loop-pattern timer.

    `identity` (model -> fidelity.BatchingNoise), for a target whose greedy lanes must stay identical: a setting
    replaces the incumbent only if its parting rate (single steps against verify calls) is no worse than the
    defaults' beyond their counting noise (parts_no_more); a faster one that parts more often is passed over, and the
    table says so."""
    compile = compile or compile_model
    fidelity = fidelity or agreement
    timer = timer or (lambda models, other: race(models, other, sample_target if role == "target" else sample_draft))
    trials: list[Trial] = []
    best = Trial(role, DEFAULT)
    baseline = None  # the defaults' trial, once its parting rate is measured
    for dimension in DIMENSIONS:
        judged = {t.setting: t.parting_rate for t in trials}  # a parting rate is measured once per setting
        options = [Trial(role, s, parting_rate=judged.get(s, float("nan")))
                   for s in candidates(best.setting, dimension, cpu_flags, cores)]
        if len(options) < 2:
            continue
        models = {}  # the faithful candidates' compiles, kept for the timing passes
        for trial in options:
            model = compile(trial.setting.apply(base))
            trial.agreement = fidelity(model, probes)
            trial.faithful = trial.agreement >= FAITHFUL
            log(f"  {role} {trial.setting.describe()}: keeps {trial.agreement:.1%} of the reference's greedy choices")
            if trial.faithful:
                models[id(trial)] = model
        faithful = [t for t in options if t.faithful]
        for trial, seconds in zip(faithful, timer([models[id(t)] for t in faithful], other)):
            trial.seconds = seconds
        incumbent = next((t for t in faithful if t.setting == best.setting), None)
        # Times of one race compare; across races the machine may have drifted, so ratios are chained through the
        # incumbent, which runs in every race.
        scale = best.relative if best.relative == best.relative else 1.0
        for trial in faithful:
            trial.relative = scale * trial.seconds / incumbent.seconds if incumbent else float("nan")
            log(f"  {role} {trial.setting.describe()}: {trial.seconds * 1e3:.1f} ms ({trial.relative:.2f}× the defaults)")
        trials = [t for t in trials if all(t.setting != o.setting for o in options)] + options  # the latest timing of each
        faster = sorted((t for t in faithful if incumbent is None or t.seconds < (1 - MARGIN) * incumbent.seconds),
                        key=lambda t: t.seconds)
        if identity is not None and faster:
            if baseline is None:
                default = next((t for t in faithful if t.setting == DEFAULT), incumbent)
                if default:
                    _judge_identity(default, models[id(default)], identity, log)
                baseline = default
            # fastest first, judged one at a time until one parts no more often than the defaults (~1 min each)
            faster = next(([t] for t in faster
                           if parts_no_more(_judge_identity(t, models[id(t)], identity, log), baseline)), [])
        models.clear()
        gc.collect()
        if faster:
            best = faster[0]
        elif incumbent is not None:
            best = incumbent
    for trial in trials:
        trial.chosen = trial.setting == best.setting
    return trials


IDENTITY_POSITIONS = 320  # built-in code and prose answer tokens scored by single steps and by verify calls (~1 min)
IDENTITY_SIZES = (2, 4, 8, 13)  # verify-call sizes tried: K = 1, 3, 7 and 12


def keeps_identity(target: ModelSettings) -> bool:
    """Whether tune holds this target to the defaults' parting rate: every target but the fastest configuration's,
    which trades identity for speed by design."""
    from specdemo.settings import CONFIGURATIONS

    fastest = CONFIGURATIONS["fastest"][0]
    return (target.source, target.precision) != (fastest.source, fastest.precision)


def identity_judge(tokenizer, examples: list[dict]):
    """model -> fidelity.BatchingNoise over the built-in code answers and prose answers (assets/prose.json, where
    near-ties are common), up to IDENTITY_POSITIONS tokens."""
    from specdemo.fidelity import batching_noise

    prose = builtin.prose_answers()
    mixed = [e for pair in zip(examples, prose) for e in pair] + examples[len(prose):] + prose[len(examples):]
    pairs = [encode(tokenizer, e) for e in mixed]  # code and prose in turns, so a cap keeps both
    return lambda model: batching_noise(model, pairs, IDENTITY_POSITIONS, IDENTITY_SIZES)


def parts_no_more(trial: Trial, defaults: Trial | None) -> bool:
    """Whether `trial`'s verify calls part from its single steps no more often than the defaults', counting noise aside.
    The defaults' partings are a count of rare events: a candidate may part up to one standard deviation of that count
    (at least one parting) more often over as many positions. 3 partings against the defaults' 2 in 320 positions is no
    evidence of a difference (the GGUF's blocks in groups of 16 on the Zen 5, 18 % faster); 6 against 2 is (bf16)."""
    if defaults is None:
        return True
    expected = defaults.parting_rate * trial.parting_positions / 1000
    return trial.parting_rate * trial.parting_positions / 1000 <= expected + max(1.0, expected ** 0.5)


def _judge_identity(trial: Trial, model, identity, log) -> Trial:
    """The trial, its parting rate (per 1,000 positions) measured once and kept on it."""
    if trial.parting_rate != trial.parting_rate:
        noise = identity(model)
        trial.parting_rate, trial.parting_positions = noise.parting_rate, noise.positions
        log(f"  {trial.role} {trial.setting.describe()}: greedy choices of verify calls differ from single steps at "
            f"{trial.parting_rate:.1f} per 1,000 positions")
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
    for role, base, partner in roles:
        log(f"{role}: the reference (f32, no dynamic quantization), for fidelity")
        reference = compile_model(REFERENCE.apply(base))
        probes = probes_of(reference, tokenizer, examples)
        del reference
        gc.collect()
        other = None  # the previous partner's compile goes before the next one loads
        gc.collect()
        if role == "draft":
            other = compile_model(tune_choice(trials, "target", target))
        else:  # the target is timed beside the draft as this machine runs it: tuned if it is, else the defaults
            # The draft as this machine runs it, its LM head trimmed where the plan chose so (the tokenizer says how).
            other = compile_model(profile.resolve(draft) if draft_done else DEFAULT.apply(partner), tokenizer)
        judge = identity_judge(tokenizer, examples) if role == "target" and keeps_identity(target) else None
        trials += search(role, base, other, probes, log, flags, cores, identity=judge)
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
        lambda settings: compile_model(setting.apply(settings), tokenizer),
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
    tuned_target = compile_model(profile.resolve(target))
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
