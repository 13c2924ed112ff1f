"""Pure renderers: events and summaries in, HTML strings and chart frames out. No gradio here, so tests
check what the page shows without a browser."""

from __future__ import annotations

import base64
import html

import pandas as pd

from specdemo.decoding import planner
from specdemo.decoding.drafters import strategy
from specdemo.decoding.events import ACCEPTED, BONUS, CORRECTED, TokenEvent
from specdemo.learning.disk import size
from specdemo.names import AUTOREGRESSIVE, GENAI, LANES, SPECULATIVE
from specdemo.results.figures import RESULTS, figure, placed, value
from specdemo.results.failures import Failure
from specdemo.results.lane import Result, finished
from specdemo.results.metrics import Summary
from specdemo.results.parting import Parting, first_difference
from specdemo.results.record import Record
from specdemo.results.would import sentences as would_sentences
from specdemo.run import genai
from specdemo.settings import GenerationSettings
from specdemo.text import shown
from specdemo.serve.downloads import Download
from specdemo.serve.engines import race_threads
from specdemo.serve.lanes import LaneRun
from specdemo.serve.values import RACE

# How the speculative lane names each provenance; each has a CSS class sd-<source> in assets/style.css
# (Okabe-Ito colours, readable with red-green colour blindness, plus an underline style per source).
PROVENANCE = {ACCEPTED: "accepted draft", CORRECTED: "corrected by target", BONUS: "bonus"}
LANE_COLOURS = {AUTOREGRESSIVE: "#7f7f7f", SPECULATIVE: "#0072B2", GENAI: "#E69F00"}  # the timeline chart's series
COST_COLOURS = {"this machine": "#0072B2", "n steps": "#D55E00", "1 step": "#009E73"}  # the cost chart's series
STOPPED_NOTE = "Stopped before both lanes finished: no speedup figures for this run."


def escape(text: str) -> str:
    # gr.HTML runs its value through a template engine: braces and dollars become entities so model
    # output such as f"{x}" or `${y}` shows literally; bidirectional controls are shown, never obeyed (text.shown).
    return html.escape(shown(text), quote=True).replace("{", "&#123;").replace("}", "&#125;").replace("$", "&#36;")


def note(text: str) -> str:
    return f'<div class="sd-notes"><p>{escape(text)}</p></div>'


def token_title(event: TokenEvent) -> str:
    """The hover text of one token: its step, its provenance and, when sampling, p_target and p_draft."""
    parts = [f"step {event.step}", PROVENANCE.get(event.source, "target")]
    if event.p_target is not None:
        parts.append(f"p_target {event.p_target:.3f}")
    if event.p_draft is not None:
        parts.append(f"p_draft {event.p_draft:.3f}")
    return " · ".join(parts)


def render_tokens(events: list[TokenEvent]) -> str:
    """Tokens as HTML: one span per token, coloured by provenance, with rejected drafts struck through where the
    target rejected them (the CSS class sd-rejected; the page can hide them)."""
    parts = []
    for event in events:
        if event.rejected_text:
            title = f"step {event.step} · {len(event.rejected)} draft token(s) rejected"
            parts.append(f'<del class="sd-rejected" title="{escape(title)}">{escape(event.rejected_text)}</del>')
        if event.text:
            parts.append(f'<span class="sd-tok sd-{event.source}" title="{escape(token_title(event))}">{escape(event.text)}</span>')
    return "".join(parts)


def render_stream(events: list[TokenEvent], start: int, reset: bool) -> str:
    """What a lane's text box receives in one update: the tokens from `start` on (all of them when `reset`), which the
    page appends to what it shows (page.STREAM_JS), so an update costs the new tokens, not the whole text again."""
    return (f'<div class="sd-delta" data-from="{start}" data-to="{start + len(events)}" data-reset="{int(reset)}">'
            f"{render_tokens(events)}</div>")


def tiles(cells: list[tuple[str, str]], extra_class: str = "") -> str:
    body = "".join(
        f'<div class="sd-tile"><div class="sd-value">{escape(value)}</div><div class="sd-label">{escape(label)}</div></div>'
        for label, value in cells
    )
    return f'<div class="sd-tiles {extra_class}">{body}</div>'


def render_lane_figures(lane: LaneRun, now: float) -> str:
    """Elapsed time, tokens, tokens/s and time to first token of one lane, live or final."""
    elapsed = lane.elapsed(now)
    tokens = len(lane.events)
    if lane.summary is not None:
        rate, ttft = lane.summary.tokens_per_s, lane.summary.ttft_s
    else:
        rate = tokens / elapsed if elapsed > 0 else 0.0
        ttft = lane.events[0].t if lane.events else None
    return tiles([
        ("elapsed", f"{elapsed:.1f} s"),
        (figure("tokens").label, figure("tokens").format(tokens)),
        (figure("tokens_per_s").label, figure("tokens_per_s").format(rate if tokens else None, unit=False)),
        (figure("ttft_s").label, figure("ttft_s").format(ttft)),
    ])


def describe_mode(mode: str) -> str:
    if mode == RACE:
        return f"race: both lanes at once, each with {race_threads()} inference thread(s)"
    return "one after another: each lane had the whole machine"


def render_results(record: Record, mode: str, genai_lane: LaneRun | None = None) -> str:
    """The headline figures once both lanes are done: measured against predicted speedup, mean acceptance length and
    α̂, target calls saved, which run mode produced them, what each K would have given, and GenAI's lane if it ran.
    `record.provisional`: what the engine has not learnt of this machine yet: the prediction says so."""
    ar, spec = record.autoregressive, record.speculative
    if not record.lanes_finished:
        return note(STOPPED_NOTE)
    settings, provisional = record.settings.generation, record.provisional
    a, s = ar.summary, spec.summary
    saved = a.target_calls - s.target_calls
    drafted = s.rounds > 0
    summaries = {AUTOREGRESSIVE: a, SPECULATIVE: s}
    alpha = figure("alpha_hat").format(value(figure("alpha_hat"), summaries))
    headline = tiles([(f.label, f.format(value(f, summaries))) for f in placed(RESULTS)]
                     + [("target calls saved", f"{saved} of {a.target_calls}")], "sd-results")
    drafter = strategy(s.drafter or settings.drafter).label
    plan = spec.plan
    # A lane that yielded no plan ran unpriced (no costs to plan by): its K is the settings' own
    k = (plan or planner.unpriced(settings.k_policy, strategy(settings.drafter))).describe(s.mean_k, s.rounds, s.gated)
    if drafted:
        by_position = figure("acceptance_by_position").format(s.acceptance_by_position)
        prediction = (f"Predicted from this machine's call costs at the run's own acceptance (α̂ = {alpha}; by draft "
                      f"position {by_position}), mean K = {s.mean_k:.1f}, {a.tokens} tokens and the "
                      f"prompt's prefill; the plan expected {plan.planned_speedup:.2f}× before the run. " if plan else
                      f"Predicted from this machine's call costs at the run's own acceptance (α̂ = {alpha}). ")
        prediction += (f"Leviathan et al.'s eq. 1, which prices a verify call at one step, would say "
                       f"{s.leviathan_speedup:.2f}×; draft acceptance rate (accepted ÷ proposed) {s.draft_acceptance_rate:.0%}.")
    else:
        prediction = "Nothing was drafted, so there is no acceptance to report (α̂ –)."
    if provisional:
        prediction = (f"Provisional: this machine is still being learnt in the background ({provisional}), and the plan "
                      f"and the prediction rest on that until it is. " + prediction)
    lines = [
        f"<b>Measured {escape(describe_mode(mode))}</b>, configuration {escape(record.configuration)}. Speedup = speculative "
        f"tokens/s ÷ autoregressive tokens/s ({s.tokens_per_s:.1f} ÷ {a.tokens_per_s:.1f}); {drafter}, {k}. Taken while "
        "this page streamed the lanes (an update a second): a browser on the same machine takes some CPU time from them, "
        "which <code>python -m specdemo bench --only watching</code> measures; the CLI's figures are free of it.",
        escape(plan.reason) if plan else "",
        escape(prediction),
        f"Speculative time: target {s.target_s:.2f} s ({figure('verify_call_s').label} "
        f"{figure('verify_call_s').format(s.verify_call_s)}, {figure('target_step_s').label} "
        f"{figure('target_step_s').format(a.target_step_s)}), drafting {s.draft_s:.2f} s, KV cache rollback "
        f"{s.rollback_s:.3f} s.",
        compare_outputs(ar.tokens, spec.tokens, settings, record.parting),
        escape(would_line(record.would, s)),
        render_genai_line(genai_lane, spec, settings) if genai_lane is not None else "",
    ]
    notes = "".join(f"<p>{line}</p>" for line in lines if line)
    return f'{headline}<div class="sd-notes">{notes}</div>'


def would_line(would, s: Summary) -> str:
    """One paragraph on what each K would have given on this answer (greedy only)."""
    said = would_sentences(would, s.target_calls)
    return " ".join(said + ["Greedy decoding only."] if would is not None and would.fixed else said)


def render_failures(failures: list[Failure]) -> str:
    """Where the drafts failed: a small table of rejections by what the target wanted there, with examples."""
    if not failures:
        return ""
    rows = "".join(f"<tr><td>{escape(f.kind)}</td><td>{f.count}</td><td>"
                   + ", ".join(f"<code>{escape(repr(d))}</code> → <code>{escape(repr(w))}</code>" for d, w in f.examples)
                   + "</td></tr>" for f in failures)
    return ('<div class="sd-notes"><p><b>Where the drafts failed</b>: each rejection, by what the target wanted '
            f'there (the draft\'s token → the target\'s).</p><table class="sd-failures"><thead><tr><th>the target wanted</th>'
            f"<th>rejections</th><th>examples</th></tr></thead><tbody>{rows}</tbody></table></div>")


def compare_outputs(ar: list[TokenEvent], spec: list[TokenEvent], settings: GenerationSettings,
                    parted: Parting | None = None) -> str:
    """Whether the lanes wrote the same text; where greedy lanes part (`parted`, as the run judged it), the margins
    measured there and their verdict against the compile's measured batching noise."""
    ar_ids, spec_ids = [e.id for e in ar], [e.id for e in spec]
    if not settings.greedy:
        if ar_ids == spec_ids:
            return (f"Sampling, and the two lanes' samples happen to be the same {len(ar_ids)} tokens (each is a draw "
                    "from the same distribution).")
        return "Sampling: the two lanes draw different samples from the same distribution, so their texts differ."
    if parted is None:
        if len(ar_ids) == len(spec_ids):
            return f"Both lanes produced the same {len(ar_ids)} tokens: speculation changed the speed, not the text."
        return (f"Both lanes wrote the same tokens as far as the shorter went ({min(len(ar_ids), len(spec_ids))} of "
                f"{max(len(ar_ids), len(spec_ids))}).")
    return escape(parted.sentence())


def render_genai_line(lane: LaneRun, spec: Result, settings: GenerationSettings) -> str:
    """One paragraph on GenAI's lane: its speed against our speculative lane, its acceptance, and whether its
    tokens equal ours."""
    if lane.error:
        return f"<b>OpenVINO GenAI's pipeline</b> failed: {escape(lane.error)}"
    g, s = lane.summary, spec.summary
    if not finished(lane):
        return "<b>OpenVINO GenAI's pipeline</b> was stopped before it finished."
    ours, theirs = spec.ids, [e.id for e in lane.events]
    if not settings.greedy:
        same = "sampling, so its text is a different sample from the same distribution"
    elif ours == theirs:
        same = f"its {len(theirs)} tokens equal our speculative lane's, token for token"
    else:
        same = (f"its tokens part from ours at token {first_difference(ours, theirs) + 1} (GenAI reports no logits, so "
                "the margin there is not known)")
    accepted = (f"accepted {g.accepted} of {g.proposed} drafts ({g.draft_acceptance_rate:.0%}); " if g.proposed else "")
    ratio = g.tokens_per_s / s.tokens_per_s if s.tokens_per_s else 0.0
    compiled = f"; compiled as ours but {escape(g.compiled_as)}" if g.compiled_as else ""
    return (f"<b>OpenVINO GenAI's speculative pipeline</b> ({escape(genai.describe(int(g.mean_k), g.drafter or 'model'))}"
            f"{compiled}; run last, with the whole machine): "
            f"{g.tokens_per_s:.1f} tokens/s, {ratio:.2f}× our speculative lane; {accepted}{same}.")


def timeline_series(lanes: dict[str, LaneRun]) -> dict[str, list[tuple[float, int]]]:
    """Each lane's tokens against seconds since it began, from (0, 0): the timeline chart's lines."""
    names = [*LANES, *([GENAI] if GENAI in lanes else [])]
    return {name: [(0.0, 0)] + [(event.t, i + 1) for i, event in enumerate(lanes[name].events if name in lanes else [])]
            for name in names}


def cost_frame(costs) -> pd.DataFrame:
    """The cost of scoring n tokens in one target call, in single steps, beside the two extremes."""
    # Every series is there from the first frame (the chart fixes its series then): before the machine is
    # measured, "this machine" is the one point every curve shares, (1, 1).
    n_max = costs.n_max if costs is not None else 13
    rows = [(n, costs.verify_steps(n) if costs is not None else 1.0, "this machine") for n in range(1, n_max + 1)
            if costs is not None or n == 1]
    for n in range(1, n_max + 1):
        rows.append((n, float(n), "n steps"))  # no gain from batching: speculation cannot pay
        rows.append((n, 1.0, "1 step"))  # free verification: Leviathan's assumption
    frame = pd.DataFrame(rows, columns=["tokens scored at once", "cost in single steps", "curve"])
    return frame.astype({"tokens scored at once": int, "cost in single steps": float, "curve": str})


def render_costs(costs, warm_up_s: float) -> str:
    """The sentence under the cost chart: what the curve means for speculation here, and where the model stands."""
    if costs is None:
        return note("The cost of each call is measured once this machine has warmed up.")
    return note(f"{costs.sentence()} One target step is {costs.t(1) * 1e3:.0f} ms on {costs.cpu}. The cost model was "
                f"{costs.standing()} (warm-up {warm_up_s:.1f} s, never counted in a lane's time). Near the orange line "
                "(n steps) speculation cannot pay; the green line (1 step) is what Leviathan et al.'s formula assumes.")


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


MODEL_ROWS = ("model", "parameters", "weights", "size on disk", "KV cache", "device", "inference threads", "compile settings",
              "layers · context")


def _model_cells(facts: dict | None, kv_cache_bytes: int | None, threads: int) -> list[str]:
    """One column of the model panel, in MODEL_ROWS order, from LoadedModel.describe()."""
    if facts is None:
        return ["–"] * len(MODEL_ROWS)
    kv_size = size(kv_cache_bytes) if kv_cache_bytes is not None else "– until a run"
    return [
        facts["name"],
        _count(facts["parameters"]),
        facts.get("weights", facts["precision"].upper())
        + (" (the draft plan's choice)" if facts.get("precision_from") == "the draft plan" else ""),
        size(facts["size_on_disk_bytes"]),
        f'{facts["kv_cache_precision"]}, {kv_size}',
        facts["device"],
        str(threads) if threads else "all cores",
        facts.get("compile_settings", "–") + (f' ({facts["tuned"]})' if facts.get("tuned") else " (not tuned: python -m specdemo tune)"),
        f'{facts["layers"]} · {facts["context_length"]:,} tokens',
    ]


def render_disk(items) -> str:
    """One line under the model panel: how much specdemo keeps on disk, and the command that lists it."""
    total = sum(item.bytes for item in items)
    by_kind = {}
    for item in items:
        by_kind[item.kind] = by_kind.get(item.kind, 0) + item.bytes
    parts = ", ".join(f"{kind.replace('-', ' ')} {size(n)}" for kind, n in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    return (f'<p class="sd-disk">On disk: {escape(size(total))} ({escape(parts)}). '
            "<code>python -m specdemo clean</code> lists it and removes what can go.</p>")


def render_models(target: dict, draft: dict | None, threads: int = 0, kv_cache_bytes: dict | None = None,
                  disk_note: str = "") -> str:
    """The model panel: target and draft side by side, with KV cache sizes once a run has filled them."""
    kv = kv_cache_bytes or {}
    columns = [_model_cells(target, kv.get("target"), threads), _model_cells(draft, kv.get("draft"), threads)]
    body = "".join(
        f"<tr><th>{label}</th>" + "".join(f"<td>{escape(column[i])}</td>" for column in columns) + "</tr>"
        for i, label in enumerate(MODEL_ROWS)
    )
    table = f'<table class="sd-models"><thead><tr><th></th><th>target</th><th>draft</th></tr></thead><tbody>{body}</tbody></table>'
    return table + disk_note


DOWNLOAD_LABEL = "Download this run (JSON)"
# The download looks like Gradio's small secondary button, by its theme's variables.
BUTTON_STYLE = ("display:inline-block;padding:var(--size-1) var(--size-3);border-radius:var(--button-small-radius);"
                "border:1px solid var(--button-secondary-border-color);background:var(--button-secondary-background-fill);"
                "color:var(--button-secondary-text-color);font-size:var(--button-small-text-size);text-decoration:none")


def render_download(download: Download | None) -> str:
    """The download button: a link that holds the finished run itself (a base64 data: URL) for the browser to save as
    its file, so nothing is fetched from the server (serve/downloads.py); greyed out until a run has finished."""
    if download is None:
        return f'<span class="sd-download" aria-disabled="true" style="{BUTTON_STYLE};opacity:.5">{DOWNLOAD_LABEL}</span>'
    data = base64.b64encode(download.text.encode("utf-8")).decode("ascii")
    return (f'<a class="sd-download" download="{escape(download.name)}" style="{BUTTON_STYLE}" '
            f'href="data:application/json;base64,{data}">{DOWNLOAD_LABEL}</a>')


def render_legend() -> str:
    swatches = "".join(f'<span class="sd-tok sd-{source}">{label}</span>' for source, label in PROVENANCE.items())
    return (f'<div class="sd-legend">{swatches}<del class="sd-rejected">rejected draft</del>'
            '<span class="sd-hint">hover a token for its step and probabilities</span>'
            '<label class="sd-toggle"><input type="checkbox" checked> show rejected drafts</label></div>')


def render_background(progress, applied: str = "") -> str:
    """The line under the status: what the background work (serve/progress.Progress) does, how far it is and what it has
    done so far, with `applied` (what the page now runs under, in words); "" when there is no work."""
    if progress is None:
        return ""
    minutes = f"{progress.seconds / 60:.0f} min"
    if progress.state == "running":
        where = f": {progress.detail}" if progress.detail else ""
        paused = " Paused while a visitor's run holds the machine." if progress.held else ""
        line = (f"Background work, step {progress.index} of {progress.count} ({minutes} so far, at low priority): "
                f"{progress.step}{where}.{paused}")
    elif progress.state == "done":
        line = f"Background work done in {minutes}."
    else:
        line = f"Background work stopped at step {progress.index} of {progress.count} ({progress.step}); its log says why."
    done = f" Done: {'; '.join(progress.finished)}." if progress.finished else ""
    skipped = f" Skipped, memory did not allow it: {'; '.join(progress.skipped)}." if progress.skipped else ""
    skipped += f" Not run, as it could not pay here: {'; '.join(progress.passed_over)}." if progress.passed_over else ""
    applied = f" Applied: {applied}." if applied else ""
    return f'<p class="sd-background">{escape(line + done + skipped + applied)}</p>'


def preparing_status(fraction: float | None, message: str) -> str:
    """The status line while models are prepared: the stage, how far, and what to expect."""
    done = f" ({fraction:.0%})" if fraction is not None else ""
    return (f"**Preparing the models:** {message}{done}. The first start builds them once from the GGUF files (17-27 s "
            "measured on other quiet 2-core Xeons and Zen 3s, not on this machine); later starts take seconds.")
