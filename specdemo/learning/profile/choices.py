"""What tune chose for this machine: the machine profile's `tune` section, holding each model's compile setting (by
source, precision and device) and each draft model's plan. Pure functions over that section (a dict): the profile
(specdemo/learning/profile/__init__.py) reads it wherever a model is compiled (ours, GenAI's lane, the bench's peers) and
applies it where the settings leave the choice open; `python -m specdemo tune` (specdemo/learning/tune.py, the measuring) and
the draft plan write it through `with_tune`.

    {"models": {model_key: {setting, seconds, relative, tuned_at[, from]}},
     "drafts": {draft_key: {precision, head_tokens, options, planned_at, busy_plans, answers, head_rule}},
     "faithful": {target source: {precision, seconds: {precision: step s}, chosen_at}},
     "trials": [the last tune's trials], "changed_ns": when a choice last changed}
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

from specdemo.host import machine
from specdemo.learning.builtin import DRAFT_PLAN_ANSWERS
from specdemo.learning.draft_choice import choose, from_dict, to_prepare
from specdemo.models import kernels, sources
from specdemo.models.split_head import RULE
from specdemo.settings import AUTO, DRAFT_PRECISION, FAITHFUL, FAITHFUL_PRECISIONS, FIRST_DRAFT_PRECISIONS, ModelSettings

FROM_PLAN = "the draft plan"  # marks a compile setting a precision got from the draft plan, not from its own search
# A draft plan priced while the host was busy (its choice provisional) is made again by the next start's background
# work (needs_plan), until one is clean or this many were busy in a row: two empty homes on one machine, one of them
# loaded, chose int4 with the full head (1.36x at K = 2) and int4 with a 16k head (1.51x at K = 5), both provisional.
BUSY_PLANS = 3
# What a plan's acceptance was measured on and under: the built-in answers, and the rule by which a split head takes
# its other rows (split_head.RULE). A plan measured otherwise is made again (needs_plan).
MEASURED_UNDER = {"answers": list(DRAFT_PLAN_ANSWERS), "head_rule": list(RULE)}


@dataclass(frozen=True)
class Setting:
    """What tune varies for one model."""

    dynamic_quantization_group_size: int  # 0: off; -1: the plugin's own (32 in OpenVINO 2024–2026)
    inference_precision: str  # f32, bf16, f16; "": ours (f32 on the CPU: compat.compile_config)
    kv_cache_precision: str  # f32, f16, u8; "": ours (f32 on the CPU)
    num_threads: int = 0  # 0: every core

    def apply(self, base: ModelSettings) -> ModelSettings:
        return replace(base, **asdict(self))

    def describe(self) -> str:
        group = self.dynamic_quantization_group_size
        text = "dyn. quant. default" if group == -1 else f"group {group}" if group else "no dyn. quant."
        threads = f", {self.num_threads} threads" if self.num_threads else ""
        return f"{text}, {self.inference_precision or 'f32'}, KV {self.kv_cache_precision or 'f32'}{threads}"


# What a compile gets without tune, in the very settings an untuned compile has, so that a pair tune leaves at the
# defaults is the pair the page compiled and measured already (the same cost curve, batching noise and acceptance keys).
DEFAULT = Setting(-1, "", "")


REFERENCE = Setting(0, "f32", "f32")  # the fidelity reference: no dynamic quantization


def model_key(settings: ModelSettings) -> str:
    # Compile settings are chosen on the full head and serve every head size (the head is one MatMul of many).
    return f"{settings.source}/{settings.precision}/{settings.device}/head0"


def draft_key(settings: ModelSettings) -> str:
    # One draft plan per draft model and device: its options span the precisions and head sizes it priced.
    return f"{settings.source}/{settings.device}"


def searched(draft: ModelSettings) -> ModelSettings:
    """The draft whose compile settings tune searches: an auto precision searches DRAFT_PRECISION (the draft plan then
    prices the other precisions under the same setting)."""
    return replace(draft, precision=DRAFT_PRECISION) if draft.precision == AUTO else draft


def planned_options(settings: ModelSettings, tune: dict) -> list:
    """The draft plan's priced options for this draft model on this machine (none: no plan yet, or not on the CPU)."""
    entry = _entry("drafts", draft_key(settings), tune) if settings.device.upper().startswith("CPU") else None
    try:
        return [from_dict(o) for o in entry["options"]] if entry else []
    except (KeyError, TypeError, ValueError):
        return []


def resolve_precision(settings: ModelSettings, tune: dict) -> ModelSettings:
    """`settings` with a faithful precision replaced by this machine's faithful layout (resolve_faithful) and an auto
    one by the draft plan's choice where its IR is prepared, else by DRAFT_PRECISION (without a plan, as unplanned_draft
    says); an explicit precision is kept."""
    return resolve_draft(resolve_faithful(settings, tune), tune, heads=False)


def resolve_faithful(settings: ModelSettings, tune: dict) -> ModelSettings:
    """`settings` with a faithful precision replaced by the layout this machine chose (target_choice), or, before it
    chose or where its choice is not prepared, by the first of FAITHFUL_PRECISIONS that is prepared (nothing to
    convert), else the first of them; any other precision is kept."""
    if settings.precision != FAITHFUL:
        return settings
    if not sources.is_gguf(settings.source):  # a GGUF layout needs a GGUF: INT8 is the faithful one of any other source
        return replace(settings, precision="int8")
    chosen = (_entry("faithful", settings.source, tune) or {}).get("precision")
    order = sorted(kernels.runnable(FAITHFUL_PRECISIONS), key=lambda p: p != chosen)  # the choice, then the quickest
    ready = [p for p in order if sources.is_prepared(replace(settings, precision=p))]
    return replace(settings, precision=(ready or order)[0])


def for_plugin(settings: ModelSettings, tune: dict) -> ModelSettings:
    """`settings` as OpenVINO's own pipelines (GenAI's lane) can load them, where they would run specdemo's kernels
    (kernels.ON_KERNELS, which GenAI does not load): a faithful target gets the plugin's faithful layout whose step the
    race timed fastest, else the first of them that is prepared, else the first; an auto draft that runs on them here
    (unplanned_draft, or the plan's choice) gets DRAFT_PRECISION, what it runs once the background has prepared it. Anything
    else is unchanged (an explicit gguf-native stays: GenAI says it cannot load it)."""
    if settings.precision == AUTO and resolve_draft(settings, tune, heads=False).precision in kernels.ON_KERNELS:
        return replace(settings, precision=DRAFT_PRECISION)
    if settings.precision != FAITHFUL or resolve_faithful(settings, tune).precision != kernels.NATIVE:
        return settings
    plugins = [p for p in FAITHFUL_PRECISIONS if p != kernels.NATIVE]
    seconds = (_entry("faithful", settings.source, tune) or {}).get("seconds", {})
    timed = sorted((seconds[p], p) for p in plugins if p in seconds)
    ready = [p for p in plugins if sources.is_prepared(replace(settings, precision=p))]
    return replace(settings, precision=(timed[0][1] if timed else (ready or plugins)[0]))


def faithful_choice(target: ModelSettings, tune: dict) -> dict | None:
    """This machine's faithful choice for the target's source ({precision, seconds, chosen_at}), None before it chose."""
    return _entry("faithful", target.source, tune) if target.precision == FAITHFUL else None


def with_faithful(tune: dict, target: ModelSettings, precision: str, seconds: dict[str, float]) -> dict:
    """The tune section with `precision` chosen as the faithful layout of the target's source (`seconds`: each raced
    layout's single step here); a new stamp, so a running page compiles the choice."""
    entry = {"precision": precision, "seconds": seconds, "chosen_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    return {**tune, "faithful": {**tune.get("faithful", {}), target.source: entry}, "changed_ns": time.time_ns()}


def resolve_draft(settings: ModelSettings, tune: dict, heads: bool = True) -> ModelSettings:
    """The draft plan's choice where `settings` leave it open: an auto precision, among the prepared precisions, and
    a head size of -1 (draft_choice.choose); without a plan, unplanned_draft's precision and the full head."""
    options = planned_options(settings, tune) if settings.precision == AUTO or settings.head_tokens == -1 else []
    choice = None
    if settings.precision == AUTO:
        choice = _prepared_choice(settings, options)
        fallback = DRAFT_PRECISION if options else unplanned_draft(settings)
        settings = replace(settings, precision=choice.precision if choice else fallback)
    if heads and settings.head_tokens == -1:
        if choice is None or choice.precision != settings.precision:
            choice = choose(options, settings.precision)
        settings = replace(settings, head_tokens=choice.head_tokens if choice else 0)
    return settings


def from_plan(draft: ModelSettings, tune: dict) -> bool:
    """Whether an auto draft's precision here is the draft plan's choice, not what runs before there is a plan
    (unplanned_draft) or while the plan's precisions are not prepared (DRAFT_PRECISION)."""
    return draft.precision == AUTO and _prepared_choice(draft, planned_options(draft, tune)) is not None


def _prepared_choice(draft: ModelSettings, options: list):
    """The plan's option an auto draft runs among those whose precision is prepared here (draft_choice.choose), or
    None."""
    ready = [o for o in options if sources.is_prepared(replace(draft, precision=o.precision))]
    return choose(ready, AUTO, draft.head_tokens)


def unplanned_draft(draft: ModelSettings) -> str:
    """The precision an auto draft of a GGUF runs before there is a plan: the file's own blocks on specdemo's kernels
    where they were built and the plugin has no 8-bit unit they lack (kernels.plugin_unit_beyond_ours), even once
    DRAFT_PRECISION is prepared: there the plugin's INT4 draft stepped at 0.7-1.0x the target's step, so a page before
    its plan drafted nothing (K = 0), where gguf-native's step is 0.43x (both measured on the 2-core Zen 3, avx2).
    Elsewhere DRAFT_PRECISION once prepared, and before, the first of FIRST_DRAFT_PRECISIONS that runs here (a first
    start converts no draft with NNCF). Another source than a GGUF: DRAFT_PRECISION."""
    if not sources.is_gguf(draft.source):
        return DRAFT_PRECISION
    first = kernels.runnable(FIRST_DRAFT_PRECISIONS)[0]
    if first == kernels.NATIVE and not kernels.plugin_unit_beyond_ours(machine.cpu_features()):
        return first
    return DRAFT_PRECISION if sources.is_prepared(replace(draft, precision=DRAFT_PRECISION)) else first


def chosen(settings: ModelSettings, tune: dict) -> Setting | None:
    """The setting tune chose for this model on this machine (a faithful target: for its layout here), or None."""
    entry = _entry("models", model_key(resolve_faithful(settings, tune)), tune)
    try:
        return Setting(**entry["setting"]) if entry else None
    except (KeyError, TypeError):
        return None


def gain(settings: ModelSettings, tune: dict) -> str:
    """What tune's choice bought this model, in words ("tuned at 22:41: 24% faster than the defaults"), or "" if
    untuned."""
    entry = _entry("models", model_key(resolve_faithful(settings, tune)), tune)
    if not entry:
        return ""
    when = f" at {entry['tuned_at'][11:16]}" if len(entry.get("tuned_at") or "") >= 16 else ""
    ratio = entry.get("relative")
    if not isinstance(ratio, (int, float)) or ratio != ratio:  # null (NaN before): the defaults were not timed
        return f"tuned{when}"
    return f"tuned{when}: {abs(1 - ratio):.0%} {'faster' if ratio < 1 else 'slower'} than the defaults" \
        if abs(1 - ratio) >= 0.01 else f"tuned{when}: the defaults were fastest"


def stamp(tune: dict) -> int:
    """When a choice last changed (ns since the epoch), 0 before any: what was compiled before a later stamp is stale
    (serve/engines.py compiles it again between visitors' runs)."""
    value = tune.get("changed_ns", 0)
    return value if isinstance(value, int) else 0


def record(draft: ModelSettings, tune: dict) -> dict:
    """What the tune holds, for a benchmark's record: every trial of the last tune (settings × times) and the draft
    plan of `draft` (its options), or {} when the machine is not tuned."""
    if not tune.get("trials"):
        return {}
    plan = tune.get("drafts", {}).get(draft_key(draft)) if isinstance(tune.get("drafts"), dict) else None
    return {"trials": tune["trials"], "draft_plan": plan if isinstance(plan, dict) else None}


def _entry(section: str, key: str, tune: dict) -> dict | None:
    """One entry of the tune, or None (none yet; a damaged one only loses the choice)."""
    entries = tune.get(section)
    entry = entries.get(key) if isinstance(entries, dict) else None
    return entry if isinstance(entry, dict) else None


def apply(settings: ModelSettings, tune: dict) -> ModelSettings:
    """`settings` with tune's choice for this machine where they leave the choice open (the defaults: an auto draft
    precision, no precision hint, no KV precision, the plugin's group size, every core, the head size left at -1).
    Explicit settings win."""
    cpu = settings.device.upper().startswith("CPU")
    settings = resolve_draft(resolve_faithful(settings, tune), tune)
    setting = chosen(settings, tune) if cpu else None
    if setting is None:
        return settings
    return replace(settings,
                   dynamic_quantization_group_size=(setting.dynamic_quantization_group_size
                                                    if settings.dynamic_quantization_group_size == -1
                                                    else settings.dynamic_quantization_group_size),
                   inference_precision=settings.inference_precision or setting.inference_precision,
                   kv_cache_precision=settings.kv_cache_precision or setting.kv_cache_precision,
                   num_threads=settings.num_threads or setting.num_threads)


def with_tune(tune: dict, trials: list, settings: dict[str, ModelSettings], drafts: list | None = None) -> dict:
    """The tune section with the chosen setting of each model and the draft plan kept (and every trial, for the
    record). The draft's other precisions the plan priced get the draft's setting too (they were measured under it),
    unless tuned on their own."""
    models = dict(tune.get("models", {}))
    # an auto draft was searched as int4, a faithful target at its layout here
    settings = {role: searched(resolve_faithful(model, tune)) for role, model in settings.items()}
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    for trial in trials:
        if trial.chosen:
            models[model_key(settings[trial.role])] = {"setting": asdict(trial.setting), "seconds": trial.seconds,
                                                       "relative": trial.relative, "tuned_at": now}
    tune = {**tune, "models": models, "changed_ns": time.time_ns()}
    if drafts:
        from specdemo.learning.draft_choice import to_dict

        best = next(o for o in drafts if o.chosen)
        before = tune.get("drafts", {}).get(draft_key(settings["draft"]), {})
        busy_plans = before.get("busy_plans", 0) + 1 if best.provisional else 0
        tune["drafts"] = {**tune.get("drafts", {}), draft_key(settings["draft"]): {
            "precision": best.precision, "head_tokens": best.head_tokens, "options": [to_dict(o) for o in drafts],
            "planned_at": now, "busy_plans": busy_plans, **MEASURED_UNDER}}
        measured_under = models.get(model_key(settings["draft"]))
        for option in drafts:
            key = model_key(replace(settings["draft"], precision=option.precision))
            own = models.get(key)  # a setting tuned for this precision itself stays
            if measured_under and (own is None or own.get("from") == FROM_PLAN):
                models[key] = {**measured_under, "relative": float("nan"), "from": FROM_PLAN}
    if trials:  # a draft plan alone keeps the tune's record
        tune["trials"] = [{**asdict(t), "setting": asdict(t.setting)} for t in trials]
    return tune


def provisional_plan(draft: ModelSettings, tune: dict) -> bool:
    """Whether the draft plan was priced on a busy host and is to be made again (fewer than BUSY_PLANS busy in a row):
    what a page makes again as soon as the host is quiet, without waiting for its next start."""
    busy = (_entry("drafts", draft_key(draft), tune) or {}).get("busy_plans", 0)
    return (draft.precision == AUTO or draft.head_tokens == -1) and 0 < busy < BUSY_PLANS


def needs_plan(draft: ModelSettings, tune: dict) -> bool:
    """Whether the draft plan is missing something a draft left to it could run: no plan yet, a prepared precision
    it did not price, a plan priced on a busy host (provisional) fewer than BUSY_PLANS times in a row, or one whose
    acceptance was measured otherwise (MEASURED_UNDER: before 2026-11-30, code alone and a split head's other rows
    where unsure only)."""
    if draft.precision != AUTO and draft.head_tokens != -1:
        return False
    priced = {o.precision for o in planned_options(draft, tune)}
    precisions = to_prepare(draft) if draft.precision == AUTO else (draft.precision,)
    entry = _entry("drafts", draft_key(draft), tune) or {}
    return not priced or provisional_plan(draft, tune) or any(entry.get(k) != v for k, v in MEASURED_UNDER.items()) or \
        any(p not in priced and sources.is_prepared(replace(draft, precision=p)) for p in precisions)
