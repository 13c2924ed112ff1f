"""Which faithful layout a target left to this machine runs here (precision FAITHFUL, the default target's).

The full-fidelity layouts (settings.FAITHFUL_PRECISIONS: the GGUF's own Q4_K blocks with its Q6_K per channel in 8
bits, NNCF's INT8 per channel, and the file's own blocks on specdemo's kernels where they run) keep the GGUF's greedy
choices about as well as each other (`bench --only fidelity`), so the one to run is the one whose calls are fastest
here: the autoregressive lane is the page's baseline, and a slow baseline flatters the speedup. Which one that is
depends on the kernels for the CPU: INT8 on the 2-core AMX Xeon (gguf-mixed's step 1.10-1.15x INT8's), gguf-mixed on
a 2-core Zen 4 (our autoregressive lane at 0.67x llama.cpp's rate against INT8's 0.57x) before specdemo's kernels.

So `python -m specdemo tune` runs `choose` before it tunes the target: each layout prepared (tens of seconds from the
GGUF), compiled with its own compile setting (the defaults until tuned), and raced on a single step as the
autoregressive lane makes them plus a verification call as the speculative lane makes them (race.race with
race.sample_step_and_verify); the challenger replaces the layout the page ran first only when clearly MARGIN faster.
The choice and the raced times are kept in the machine profile (Profile.keep_faithful) and read wherever a target is
resolved (profile.choices.resolve_faithful).
"""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Callable

from specdemo.learning.candidates import CPU
from specdemo.learning.race import FAITHFUL_VERIFY, race, sample_step_and_verify
from specdemo.models import kernels, sources
from specdemo.settings import FAITHFUL, FAITHFUL_PRECISIONS, ModelSettings


def plugin_may_win(incumbent: str, cpu: CPU) -> bool:
    """Whether the plugin's layouts may beat `incumbent` (a target's layout) on `cpu`, so that the faithful race runs
    and the fastest configuration's INT4 target is prepared in the background: not where it is specdemo's kernels
    and the plugin has no 8-bit unit they lack (CPU.int8_unit_beyond_ours): there ours won every race measured, by
    more than any host's noise (gguf-mixed's single step and verification 1.43x ours, INT8's 1.26x, on the 2-core
    AVX-512 VNNI Xeon family 6 model 207; on AVX2, ours 1.32x llama.cpp's rate where the plugin ran 0.5-0.7x it), and
    the race would cost its INT8 conversion and the race itself, 2.5 min of a new machine's background work. The
    plugin's INT4 target ran as fast as ours there (single step 1.06x, 5-token call 0.91x, same Xeon), its answers
    another model's: the fastest configuration's 3.5 min of preparing and tuning it would buy nothing either."""
    return incumbent != kernels.NATIVE or cpu.int8_unit_beyond_ours


def choose(target: ModelSettings, log: Callable[[str], None] = print, profile=None, compile=None, timer=None,
           cpu: CPU | None = None) -> str:
    """The faithful layout `target` (precision FAITHFUL) runs on this machine, raced and kept in the profile.
    `compile(settings)` (a compile admitted by memory, or None when memory does not allow it; default: the layout
    prepared, then tune.compiled_in_bound) and `timer(incumbent, challenger) -> race.Verdict` (default: race.race on a single step and a verification) are
    what tests replace; `cpu` the CPU whose class decides whether there is a race (raced; default: this one's)."""
    from specdemo.learning.profile import machine_profile

    assert target.precision == FAITHFUL
    profile = profile or machine_profile()
    compile = compile or (lambda settings: _compiled(settings, log))
    timer = timer or (lambda incumbent, challenger: race(incumbent, challenger, None, sample_step_and_verify))
    incumbent = profile.resolve_precision(target).precision  # what the page ran until now
    layouts = kernels.runnable(FAITHFUL_PRECISIONS)
    cpu = cpu or CPU.here()
    if not plugin_may_win(incumbent, cpu):
        log(f"target: {incumbent} stays without a race: on this CPU ({cpu.describe()}) the plugin's faithful layouts "
            "have no 8-bit unit specdemo's kernels lack (AMX, or VNNI without AVX-512), and they lost every race "
            "measured on such CPUs")
        profile.keep_faithful(target, incumbent, {})
        return incumbent
    if layouts != FAITHFUL_PRECISIONS:
        log(f"target: {kernels.NATIVE} is not raced: {kernels.unavailable()}")
    log(f"target: the faithful layout, {incumbent} (running) against "
        f"{', '.join(p for p in layouts if p != incumbent)}: each one's single step and {FAITHFUL_VERIFY}-token "
        "verification, raced")
    held = compile(profile.resolve(replace(target, precision=incumbent)))
    if held is None:
        log("target: memory does not allow the faithful layouts' race now; the running one stays")
        return incumbent
    seconds = {}
    for precision in layouts:
        if precision == incumbent:
            continue
        challenger = compile(profile.resolve(replace(target, precision=precision)))
        if challenger is None:
            log(f"target: {precision} skipped (memory); {incumbent} stays")
            continue
        verdict = timer(held, challenger)
        seconds.update({incumbent: verdict.incumbent_s, precision: verdict.challenger_s})
        log(f"target: {precision}'s single step and verification take {verdict.ratio:.2f}x {incumbent}'s "
            f"({verdict.low:.2f}-"
            f"{verdict.high:.2f}, {verdict.pairs} pairs): " + ("faster, it runs from now on" if verdict.faster
                                                              else f"not clearly faster, {incumbent} stays"))
        if verdict.faster:
            incumbent, held = precision, challenger
        del challenger
        gc.collect()
    del held
    gc.collect()
    profile.keep_faithful(target, incumbent, seconds)
    return incumbent


def _compiled(settings: ModelSettings, log: Callable[[str], None]):
    """The layout prepared (converted from the GGUF when missing, in a child that waits for memory itself), then
    compiled once memory allows it (tune.compiled_in_bound), or None."""
    from specdemo.learning import tune

    sources.prepare(settings)  # its stages on the standard output, as `prepare` prints them
    return tune.compiled_in_bound(settings, f"compiling the target at {settings.precision}, for the faithful layout", log,
                                  fresh=True)
