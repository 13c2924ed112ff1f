"""`python -m specdemo tune`: what this machine learns on the command line. The faithful layout raced, the compile
settings searched and the draft planned (specdemo/learning/ measures them), the choice checked for exactness and
printed as a table; `--draft-plan` alone, and `--forget`.
"""

from __future__ import annotations

import time

from specdemo.learning import builtin, identity, target_choice, tune
from specdemo.learning.draft_choice import left_out, table
from specdemo.learning.profile import choices, machine_profile
from specdemo.settings import FAITHFUL, RunSettings


def tune_machine(settings: RunSettings, again: bool = True) -> int:
    """Measure the candidate compile settings, keep the fastest faithful one per model, print the table, check that greedy
    speculative output stays exact under a target setting other than the defaults, and measure the cost model under
    the choice. `again` False leaves a draft tuned and planned before as it is (tune.tune)."""
    from specdemo.run.engine import Engine
    from specdemo.run.exactness import check_exact

    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:5.0f} s] {message}", flush=True)

    profile = machine_profile()
    if settings.target.precision == FAITHFUL and (again or profile.faithful_choice(settings.target) is None):
        target_choice.choose(settings.target, log, profile)
    target = profile.resolve_precision(settings.target)  # the faithful layout chosen: the one tuned
    trials, drafts = tune.tune(target, settings.draft, log, again=again)
    models = {"target": target, "draft": settings.draft}
    profile.keep_tune(trials, models, drafts)
    # The cost model measured again under the choice (and the batching noise, the acceptance, where not known). For
    # another configuration's target (--target-only) a quick measurement: the page learns the rest if it is ever used.
    engine = Engine.load(settings)
    engine.warm_up(fresh=True, log=log, quick=not again)
    # The defaults' exactness is what the tests prove; a target setting of tune's own is checked here, unless it is the
    # fastest configuration's, which trades identity for speed by design (identity.keeps_identity).
    changed = identity.keeps_identity(target) and any(t.chosen and t.setting != choices.DEFAULT
                                                      for t in trials if t.role == "target")
    if changed:
        log("checking that greedy speculative output equals autoregressive output under the choice")
    problem = check_exact(engine, [e["instruction"] for e in builtin.code_answers()]) if changed else ""
    if problem:
        for trial in trials:  # keep the defaults: a faster setting that changes the text is no setting
            trial.chosen = trial.setting == choices.DEFAULT
        for option in drafts:
            option.chosen = option is drafts[0]
        profile.keep_tune(trials, models, drafts)
        log(f"not kept: {problem}; the defaults stay")
        engine = Engine.load(settings)
        engine.warm_up(fresh=True, log=log, quick=not again)
    known = lambda value, text: text if value == value else "–"  # noqa: E731 (NaN: not measured)
    print(f"\n{'model':8}{'setting':44}{'greedy kept':>12}{'time':>10}{'vs default':>12}{'parting/1k':>12}")
    for t in trials:
        time_ = known(t.seconds, f"{t.seconds * 1e3:.1f} ms") if t.faithful else "–"
        ratio = known(t.relative, f"{t.relative:.2f}x") if t.faithful else "–"
        mark = "  <- chosen" if t.chosen else ("" if t.faithful or t.agreement != t.agreement else "  (not faithful)")
        print(f"{t.role:8}{t.setting.describe():44}{known(t.agreement, f'{t.agreement:.1%}'):>12}{time_:>10}{ratio:>12}"
              f"{known(t.parting_rate, f'{t.parting_rate:.1f}'):>12}{mark}")
    print("(only what can beat the defaults on this CPU class is raced (specdemo/learning/candidates.py); time: in the"
          " race a setting last ran in; vs default: chained through the races, each against the setting kept so far; parting/1k:"
          " positions per 1,000 of built-in code and prose answers where verify calls choose another greedy token than"
          " single steps, measured for the target settings that would replace the one kept; none may part more often"
          " than the defaults beyond the counting noise of theirs, except in the fastest configuration)")
    print_draft_plan(drafts)
    print(f"\nkept in {profile.store.path}; every compile of these models on this machine uses it (ours, GenAI's lane, the bench).")
    print(f"{engine.costs.sentence()} (the cost model, measured again under it)")
    return 0


def plan_draft(settings: RunSettings) -> int:
    """`tune --draft-plan`: the draft plan alone, kept beside the compile settings already chosen."""
    started = time.perf_counter()
    profile = machine_profile()
    target = profile.resolve_precision(settings.target)
    drafts = tune.replan_draft(target, settings.draft,
                               lambda message: print(f"[{time.perf_counter() - started:5.0f} s] {message}", flush=True))
    profile.keep_tune([], {"target": target, "draft": settings.draft}, drafts)
    print_draft_plan(drafts)
    print(f"\nkept in {profile.store.path}; it applies to the draft from the next load")
    return 0


def forget_tune() -> int:
    """`tune --forget`: this machine's compile choice and draft plan are dropped (a running page compiles again)."""
    profile = machine_profile()
    profile.forget_tune()
    print(f"forgot this machine's tune in {profile.store.path}: every compile uses the defaults until the next tune")
    return 0


def print_draft_plan(drafts: list) -> None:
    if not drafts:
        return

    print("\nthe draft plan (step: a draft step in a round; accepted: drafts equal to the target's greedy token on the "
          "built-in answers; predicted: speedup at the best K on this machine)")
    print("\n".join(table(drafts)))
    if skipped := left_out(drafts):
        print(skipped)
