"""The page's figures about a finished run, drawn as small inline SVG: what each K would have given on this answer,
acceptance by draft position, and this machine's cost surface. Pure functions (numbers in, markup out), so tests
read them without a browser, and an update sends a few kilobytes rather than a chart library's re-render.

Colours are Okabe-Ito (readable with red-green colour blindness); every series also differs by its mark or dash.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from specdemo.decoding import planner, pricing
from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import strategy
from specdemo.results.counterfactual import Counterfactual

BLUE, ORANGE, GREEN, PURPLE, GREY = "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#7f7f7f"
WIDTH, HEIGHT = 520, 290
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 34, 66  # margins around the plot area (the legend goes under it), in SVG units


@dataclass(frozen=True)
class Axes:
    """A plot area mapping data (x, y) to SVG coordinates."""

    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, value: float) -> float:
        return LEFT + (value - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return HEIGHT - BOTTOM - (value - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)


def _text(x: float, y: float, text: str, size: int = 12, anchor: str = "middle", **attributes) -> str:
    extra = "".join(f' {key.replace("_", "-")}="{value}"' for key, value in attributes.items())
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="currentColor"{extra}>'
            f"{html.escape(text)}</text>")


def _svg(parts: list[str], title: str, label: str, caption: str = "") -> str:
    """The figure: a titled, scalable SVG (its width follows the page), with `label` for screen readers and an
    optional caption under it."""
    body = "".join(parts)
    below = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return (f'<figure class="sd-chart"><svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(label)}" '
            f'xmlns="http://www.w3.org/2000/svg">{_text(WIDTH / 2, 18, title, 14, font_weight="600")}{body}</svg>'
            f"{below}</figure>")


def _axes(axes: Axes, x_ticks: list[float], y_ticks: list[float], x_title: str, y_title: str,
          x_format=lambda v: f"{v:g}", y_format=lambda v: f"{v:g}") -> list[str]:
    parts = [f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" '
             'fill="none" stroke="currentColor" stroke-opacity="0.25"/>']
    for v in x_ticks:
        parts.append(_text(axes.x(v), HEIGHT - BOTTOM + 16, x_format(v), 11))
    for v in y_ticks:
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{axes.y(v):.1f}" y2="{axes.y(v):.1f}" '
                     'stroke="currentColor" stroke-opacity="0.1"/>')
        parts.append(_text(LEFT - 6, axes.y(v) + 4, y_format(v), 11, "end"))
    parts.append(_text((LEFT + WIDTH - RIGHT) / 2, HEIGHT - BOTTOM + 32, x_title, 12))
    parts.append(_text(14, (TOP + HEIGHT - BOTTOM) / 2, y_title, 12, transform=f"rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2:.1f})"))
    return parts


def _line(axes: Axes, points: list[tuple[float, float]], colour: str, dash: str = "", width: float = 2.0) -> str:
    path = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in points)
    dashes = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="{width}"{dashes}/>'


def _legend(items: list[tuple[str, str, str]], y: float = HEIGHT - 10) -> list[str]:
    """(label, colour, dash) entries in one row under the plot."""
    parts, x = [], LEFT
    for label, colour, dash in items:
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<line x1="{x}" x2="{x + 18}" y1="{y - 4}" y2="{y - 4}" stroke="{colour}" stroke-width="2"{dashes}/>')
        parts.append(_text(x + 22, y, label, 11, "start"))
        x += 32 + 5.6 * len(label)
    return parts


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    step = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(step)) if step > 0 else 1.0
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= step)
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step) + 1)]


def placeholder(title: str, text: str) -> str:
    """A chart's frame before there is anything to draw: a title and one sentence, no empty axes."""
    return _svg([_text(WIDTH / 2, HEIGHT / 2, text, 13, opacity="0.7")], title, text)


def timeline(series: dict[str, list[tuple[float, int]]], colours: dict[str, str]) -> str:
    """Tokens generated against seconds since each lane began, a line per lane (a run is drawn as it goes)."""
    title = "Tokens generated over time"
    points = [p for line in series.values() for p in line]
    if len(points) <= len(series):  # only the origins
        return placeholder(title, "Drawn as the lanes run.")
    right = max(max(t for t, _ in points), 0.5) * 1.05
    top = max(max(n for _, n in points), 1) * 1.1
    axes = Axes(0.0, right, 0.0, top)
    parts = _axes(axes, _nice_ticks(0.0, right), _nice_ticks(0.0, top), "seconds since the lane began", "tokens")
    legend = []
    for name, line in series.items():
        dash = {"genai": "4 3"}.get(name, "")
        parts.append(_line(axes, [(t, n) for t, n in line], colours.get(name, GREY), dash))
        legend.append((name, colours.get(name, GREY), dash))
    parts += _legend(legend)
    return _svg(parts, title, "; ".join(f"{name}: {line[-1][1]} tokens in {line[-1][0]:.1f} s" for name, line in series.items()))


def would_have_given(would: Counterfactual | None, run_k: float, run_speedup: float) -> str:
    """Predicted speedup of every fixed K on this very answer, the per-round oracle, each model-free strategy, and this
    run."""
    title = "What each K would have given on this answer"
    if would is None:
        return placeholder(title, "Greedy decoding only: a sampled answer has no counterfactual.")
    replayed = {name: [(w.k, w.speedup) for w in walks] for name, walks in would.replayed.items()}
    series = [[(w.k, w.speedup) for w in would.fixed], *replayed.values()]
    values = [s for points in series for _, s in points] + [would.oracle.speedup, run_speedup, 1.0]
    k_max = max(len(points) for points in series) if any(series) else 1
    top = max(values) * 1.1
    axes = Axes(0.5, k_max + 0.5, min(0.0, min(values)), top)
    parts = _axes(axes, list(range(1, k_max + 1)), _nice_ticks(axes.y0, top), "K, drafts per round",
                  "predicted speedup", y_format=lambda v: f"{v:g}×")
    parts.append(_line(axes, [(0.5, 1.0), (k_max + 0.5, 1.0)], GREY, "2 3", 1.2))  # the target alone
    if would.fixed:
        parts.append(_line(axes, [(0.5, would.oracle.speedup), (k_max + 0.5, would.oracle.speedup)], GREEN, "6 4"))
        parts.append(_line(axes, series[0], BLUE))
        parts += [f'<circle cx="{axes.x(k):.1f}" cy="{axes.y(s):.1f}" r="3" fill="{BLUE}"/>' for k, s in series[0]]
    dashes = ["4 3", "1 3", "8 3 1 3"]  # one per model-free strategy, in their order
    for i, points in enumerate(replayed.values()):
        parts.append(_line(axes, points, ORANGE, dashes[i % len(dashes)]))
    if run_k > 0:
        x, y = axes.x(run_k), axes.y(run_speedup)
        parts.append(f'<path d="M{x - 7:.1f},{y:.1f} L{x:.1f},{y - 7:.1f} L{x + 7:.1f},{y:.1f} L{x:.1f},{y + 7:.1f} Z" '
                     f'fill="{PURPLE}" stroke="white" stroke-width="1"><title>this run: mean K {run_k:.1f}, '
                     f'measured {run_speedup:.2f}×</title></path>')
    legend = [("fixed K", BLUE, ""), ("best K each round", GREEN, "6 4")] if would.fixed else []
    legend += [(strategy(name).label, ORANGE, dashes[i % len(dashes)]) for i, name in enumerate(replayed)]
    parts += _legend(legend + [("◆ this run, measured", PURPLE, "")])
    return _svg(parts, title, f"Predicted speedup by K; best fixed K {would.best_fixed().k if would.fixed else '–'}")


def acceptance_by_position(rates: list[float], prior: list[float] | None = None) -> str:
    """Bars: for each draft position, the share of rounds that drafted a token there and kept it; the line: what the
    planner expected of the same (`prior`, by position)."""
    title = "Acceptance by draft position"
    shown = [(i, r) for i, r in enumerate(rates, start=1) if r > 0 or i == 1]
    last = max((i for i, r in enumerate(rates, start=1) if r > 0), default=0)
    if not last:
        return placeholder(title, "Nothing was drafted in this run.")
    axes = Axes(0.5, last + 0.5, 0.0, 1.1)
    parts = _axes(axes, list(range(1, last + 1)), [0.0, 0.25, 0.5, 0.75, 1.0], "position in the draft",
                  "kept when drafted", y_format=lambda v: f"{v:.0%}")
    width = 0.7 * (axes.x(1) - axes.x(0))
    for i, rate in shown[:last]:
        x, y = axes.x(i) - width / 2, axes.y(rate)
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{axes.y(0) - y:.1f}" fill="{BLUE}" '
                     f'fill-opacity="0.8"><title>position {i}: {rate:.0%}</title></rect>')
        parts.append(_text(axes.x(i), y - 4, f"{rate:.0%}", 10))
    if prior:
        parts.append(_line(axes, [(i, r) for i, r in enumerate(prior[:last], start=1)], ORANGE, "4 3"))
        parts += _legend([("the planner's prior before the run", ORANGE, "4 3")])
    return _svg(parts, title, f"Acceptance by position, first draft {rates[0]:.0%}")


ALPHAS = tuple(round(0.5 + 0.025 * i, 3) for i in range(21))  # 0.5 … 1.0


def cost_surface(costs: CostModel | None, k_max: int, run_alpha: float | None = None, run_k: float | None = None,
                 run_acceptance: pricing.Acceptance | None = None) -> str:
    """Heat map of this machine's predicted speedup over K (columns) and α (rows), the break-even line (speedup 1)
    and the run's own point (α̂, mean K); the caption names the best K at the run's own acceptance by position."""
    title = "Where speculation pays on this machine"
    if costs is None:
        return placeholder(title, "Drawn once this machine's call costs are measured.")
    ks = list(range(1, k_max + 1))
    grid = pricing.cost_surface(costs, ks, ALPHAS)
    axes = Axes(0.5, k_max + 0.5, ALPHAS[0] - 0.0125, 1.0125)
    parts = []
    cell_w, cell_h = axes.x(1) - axes.x(0), axes.y(0) - axes.y(0.025)
    for row, alpha in zip(grid, ALPHAS):
        for k, speedup in zip(ks, row):
            parts.append(f'<rect x="{axes.x(k) - cell_w / 2:.1f}" y="{axes.y(alpha) - cell_h / 2:.1f}" '
                         f'width="{cell_w + 0.5:.1f}" height="{cell_h + 0.5:.1f}" fill="{_heat(speedup)}">'
                         f"<title>K = {k}, α = {alpha:.3f}: {speedup:.2f}×</title></rect>")
    parts += _axes(axes, ks, [0.5, 0.6, 0.7, 0.8, 0.9, 1.0], "K, drafts per round", "acceptance α")
    line = [(k, a) for k in ks if (a := pricing.break_even_alpha(costs, k)) is not None]
    if line:  # clipped to the plot: below α = 0.5 the line leaves the map
        parts.append(f'<clipPath id="sd-surface-clip"><rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
                     f'height="{HEIGHT - TOP - BOTTOM}"/></clipPath><g clip-path="url(#sd-surface-clip)">')
        parts.append(_line(axes, line, "black", "", 2.2))
        parts.append(_line(axes, line, "white", "5 4", 1.2))
        parts.append("</g>")
    if run_alpha and run_k:
        x, y = axes.x(run_k), axes.y(min(max(run_alpha, ALPHAS[0]), 1.0))
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{PURPLE}" stroke="white" stroke-width="2">'
                     f"<title>this run: α̂ {run_alpha:.2f}, mean K {run_k:.1f}</title></circle>")
    sentence = planner.surface_sentence(costs, k_max, run_alpha, run_acceptance)
    return _svg(parts, title, sentence, sentence + " White line: break-even (1×); blue pays, orange costs.")


def _heat(speedup: float) -> str:
    """Blue where drafts pay, orange where they cost, white at 1×; the shade follows log2(speedup), capped at 2× / ½×."""
    t = max(-1.0, min(1.0, math.log2(max(speedup, 1e-6))))
    r, g, b = (0, 114, 178) if t > 0 else (230, 159, 0)
    mix = abs(t) ** 0.8
    return "#%02x%02x%02x" % tuple(round(255 + (c - 255) * mix) for c in (r, g, b))
