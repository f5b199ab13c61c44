"""TTFT p99 against arrival rate, one line per engine, as a small hand-written SVG (no
plotting dependency for one chart). The y axis is logarithmic: TTFTs here run from tens
of milliseconds to tens of seconds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 150, 40, 50
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def ttft_svg(title: str, series: Mapping[str, Sequence[tuple[float, float]]]) -> str:
    """`series`: engine name -> [(arrival rate req/s, TTFT p99 ms)]."""
    points = [p for line in series.values() for p in line if p[1] > 0 and math.isfinite(p[1])]
    if not points:
        raise ValueError("nothing to plot")
    x_max = max(x for x, _ in points) * 1.05
    y_lo = 10 ** math.floor(math.log10(min(y for _, y in points)))
    y_hi = 10 ** math.ceil(math.log10(max(y for _, y in points)))
    y_hi = max(y_hi, y_lo * 10)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + x / x_max * plot_w

    def sy(y: float) -> float:
        frac = (math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo))
        return TOP + plot_h * (1 - frac)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" '
        'stroke="black"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="black"/>',
    ]
    decade = y_lo
    while decade <= y_hi:
        y = sy(decade)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{decade:g}</text>')
        decade *= 10
    step = _nice_step(x_max)
    tick = 0.0
    while tick <= x_max:
        x = sx(tick)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 5}" '
                   'stroke="black"/>')  # fmt: skip
        out.append(
            f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{tick:g}</text>'
        )
        tick = round(tick + step, 6)
    out.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 10}" text-anchor="middle">'
        "arrival rate (requests/s, Poisson)</text>"
    )
    out.append(
        f'<text transform="translate(18 {TOP + plot_h / 2}) rotate(-90)" text-anchor="middle">'
        "TTFT p99 (ms, log scale)</text>"
    )
    for i, (name, line) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        kept = sorted(p for p in line if p[1] > 0 and math.isfinite(p[1]))
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in kept)
        out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>' for x, y in kept
        ]
        ly = TOP + 10 + 20 * i
        out.append(
            f'<line x1="{WIDTH - RIGHT + 15}" y1="{ly}" x2="{WIDTH - RIGHT + 40}" y2="{ly}" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        out.append(f'<text x="{WIDTH - RIGHT + 45}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _nice_step(span: float) -> float:
    raw = span / 6
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude
