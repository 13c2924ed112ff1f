"""`python -m specdemo generate`: both lanes of one instruction in a terminal, streamed with the tokens coloured by
where they came from, then their figures (each said and written as specdemo/results/figures.py describes it), where the lanes
part, what each K would have given and where the drafts failed."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specdemo.decoding.drafters import strategy
from specdemo.decoding.events import ACCEPTED, BONUS, CORRECTED, TokenEvent
from specdemo.decoding.planner import Plan
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results import runfile
from specdemo.results.failures import Failure
from specdemo.results.figures import SPECULATION, TABLE, figure, placed, value
from specdemo.results.lane import Result, drain
from specdemo.results.record import Record
from specdemo.results.would import sentences
from specdemo.settings import RunSettings
from specdemo.text import clean_instruction, shown

LONG_PROMPT_TOKENS = 300  # above this, say up front how long the prefill will take

# Terminal colours chosen to stay distinguishable for red-green colour blindness.
_COLOURS = {ACCEPTED: "\033[34m", CORRECTED: "\033[33;1m", BONUS: "\033[35m"}
_STRIKE, _RESET = "\033[9;2m", "\033[0m"


def generate(args: argparse.Namespace, settings: RunSettings) -> int:
    """`python -m specdemo generate`: both lanes on one instruction, streamed, then their figures."""
    from specdemo.run.engine import Engine
    from specdemo.run.sidebyside import SideBySide

    clean_instruction(args.instruction)  # an empty instruction is refused before the models load
    engine = Engine.load(settings, with_draft=strategy(settings.generation.drafter).needs_model)
    run = SideBySide({AUTOREGRESSIVE: engine, SPECULATIVE: engine}, args.instruction, settings)  # refused if too long
    if args.max_prompt_tokens and len(run.prompt) > args.max_prompt_tokens:
        raise ValueError(f"the prompt is {len(run.prompt):,} tokens and the command line accepts at most "
                         f"{args.max_prompt_tokens:,}; --max-prompt-tokens 0 allows up to the model's context")
    log = (lambda message: None) if args.json else (lambda message: print(f"warm-up: {message}", file=sys.stderr, flush=True))
    run.prepare(log, fresh=args.remeasure)
    if not args.json:
        print(f"warm-up {engine.warm_up_s:.1f} s (not part of any lane's time). {engine.costs.sentence()}")
        print(f"cost model: {engine.costs.standing()}")
        if len(run.prompt) > LONG_PROMPT_TOKENS:
            print(_prefill_estimate(engine, len(run.prompt), settings.generation.max_new_tokens), flush=True)
            _show_prefill_progress(engine)
    lanes = {}
    for mode in (AUTOREGRESSIVE, SPECULATIVE):
        if not args.json:
            print(f"\n== {mode} ==", flush=True)
        lanes[mode] = _consume(run.lane(mode), show=not args.json)
    record = run.finish(lanes)
    if args.save and record.finished:
        runfile.save(record, Path(args.save))
    if args.json:
        print(runfile.dumps(record))
    else:
        print_record(record)
        if args.save:
            print(f"saved to {args.save} (show it again: python -m specdemo show {args.save})")
    return 0


def _show_prefill_progress(engine) -> None:
    """A line on stderr per piece of a long prompt's prefill, on each model, with the time so far."""
    for role, model in (("target", engine.target), ("draft", engine.draft)):
        if model is None:
            continue
        began = [0.0]

        def show(done: int, total: int, role=role, began=began) -> None:
            if done == 0:
                began[0] = time.perf_counter()
                return
            print(f"prefill ({role}): {done:,} of {total:,} tokens, {time.perf_counter() - began[0]:.1f} s",
                  file=sys.stderr, flush=True)

        model.runtime.on_piece = show


def _prefill_estimate(engine, prompt_tokens: int, new_tokens: int) -> str:
    """What a long prompt will cost, from this machine's measured prefill rates and the models' cache sizes."""
    costs = engine.costs
    seconds = prompt_tokens / costs.target_prefill_tps
    draft = prompt_tokens / costs.draft_prefill_tps if costs.draft_prefill_tps else 0.0
    tokens = prompt_tokens + new_tokens
    cache = engine.target.kv_bytes_per_token() * tokens + (engine.draft.kv_bytes_per_token() * tokens if engine.draft else 0)
    return (f"a {prompt_tokens:,}-token prompt: its prefill takes about {seconds:.0f} s in each lane"
            + (f" (+{draft:.0f} s for the draft)" if draft else "") + f" on this machine; the KV caches will hold about "
            f"{cache / 2**20:,.0f} MiB. Ctrl-C stops cleanly.")


def _consume(events, show: bool) -> Result:
    """Drain one lane, printing its plan and its text as it streams when `show`."""
    colour = show and sys.stdout.isatty()

    def print_event(event) -> None:
        if isinstance(event, Plan):
            print(event.reason, flush=True)
        elif isinstance(event, TokenEvent):
            print(_render(event, colour), end="", flush=True)

    result = drain(events, on_event=print_event if show else None)
    if show:
        print()
    return result


def _render(event: TokenEvent, colour: bool) -> str:
    """A token as the terminal shows it: bidirectional and terminal controls shown, never obeyed (text.shown)."""
    if not colour:
        return shown(event.text, terminal=True)
    rejected = f"{_STRIKE}{shown(event.rejected_text, terminal=True)}{_RESET}" if event.rejected_text else ""
    start = _COLOURS.get(event.source, "")
    return f"{rejected}{start}{shown(event.text, terminal=True)}{_RESET if start else ''}"


def print_record(record: Record) -> None:
    """A finished run's figures, where its lanes part, what each K would have given and where the drafts failed."""
    _print_summaries(record.autoregressive, record.speculative, record.settings.generation.greedy, record.parting)
    _print_counterfactual(record.would, record.speculative)
    _print_failures(record.failures)


def _print_summaries(ar_result: Result, spec_result: Result, greedy: bool, parted=None) -> None:
    ar, spec = ar_result.summary, spec_result.summary
    lanes = {AUTOREGRESSIVE: ar, SPECULATIVE: spec}
    print("\n== summary ==")
    print(f"{'':28}{AUTOREGRESSIVE:>16}{SPECULATIVE:>16}")
    for f in placed(TABLE):
        print(f"{f.heading():28}{f.format(getattr(ar, f.key), unit=False):>16}{f.format(getattr(spec, f.key), unit=False):>16}")
    measured, predicted, leviathan = (figure(k) for k in ("measured_speedup", "predicted_speedup", "leviathan_speedup"))
    print(f"\n{measured.label} {measured.format(value(measured, lanes))}, {predicted.label} "
          f"{predicted.format(value(predicted, lanes))} (from this machine's costs at the run's acceptance; "
          f"{leviathan.label}, which prices a verify call at one step: {leviathan.format(value(leviathan, lanes))})")
    print("   ".join(f"{f.label} {f.format(value(f, lanes))}" for f in placed(SPECULATION))
          + f"   near-ties: {ar.near_ties} / {spec.near_ties}")
    if not greedy:
        print("note: sampling, and the two samples happen to be equal" if ar_result.ids == spec_result.ids
              else "note: sampling: the two outputs are different samples from the same distribution")
    elif parted is not None:  # where the greedy lanes part, judged once (Record.parting)
        print(f"note: {parted.sentence()}")
    print(f"legend: {_COLOURS[ACCEPTED]}accepted draft{_RESET}  {_COLOURS[CORRECTED]}corrected by target{_RESET}  "
          f"{_COLOURS[BONUS]}bonus{_RESET}  {_STRIKE}rejected draft{_RESET}" if sys.stdout.isatty() else "")


def _print_failures(failures: list[Failure]) -> None:
    """Where the drafts failed: the rejections by what the target wanted there, with examples."""
    if not failures:
        return
    print("\n== where the drafts failed (what the target wanted at each rejection) ==")
    for failure in failures:
        examples = ", ".join(f"{drafted!r} → {wanted!r}" for drafted, wanted in failure.examples)
        print(f"{failure.kind:26} {failure.count:>4}   e.g. {examples}")


def _print_counterfactual(would, spec: Result) -> None:
    """What every K would have given on this answer (greedy), a table of each K, then the page's sentences on it
    (would.sentences), and the model-free strategies'."""
    if would is None or not would.fixed:
        print("\n" + "\n".join(sentences(would, spec.summary.target_calls)))
        return
    print("\n== what each K would have given on this answer (greedy; predicted from this machine's costs) ==")
    print("K          " + "".join(f"{w.k:>7d}" for w in would.fixed))
    print("calls      " + "".join(f"{w.target_calls:>7d}" for w in would.fixed))
    print("speedup    " + "".join(f"{_times(w.speedup):>7}" for w in would.fixed))
    if would.stopped:  # each K with the confidence stop at this machine's break-even P for that K
        print("with stop  " + "".join(f"{_times(w.speedup):>7}" for w in would.stopped))
    if would.gated:  # the same in gated rounds
        print("gated      " + "".join(f"{_times(w.speedup):>7}" for w in would.gated))
    for sentence in sentences(would, spec.summary.target_calls) + would.replay_sentences():
        print(sentence)


def _times(speedup: float) -> str:
    return figure("predicted_speedup").format(speedup)
