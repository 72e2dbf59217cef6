"""How the lab's plots draw a run: a style that depends on the run's own label alone, never on which other runs a
plot shows or in what order, so a run looks the same in every plot and every report.

A label is ``METHOD@ENGINE`` with ``+r3`` when the run replays the engine's routing (``grpo@none``,
``dcgrpo@nvfp4``, ``grpo@e4m3+r3``); a frontier line is ``METHOD`` or ``METHOD+r3`` (its engine is the x axis).

* **Colour: the method.** Every method the lab ships (the files of ``configs/methods/`` and the lab's variants,
  ``training.methods.method_names``) has a fixed entry of :data:`METHODS`, no two alike: the common methods the
  strong ``tab10`` colours (``grpo`` blue, ``dcgrpo`` red, ``token_tis`` green, ``geo_mis`` purple, ``icepop``
  brown, ...), ``dcgrpo_paper`` and the lab's variants darker ones. Any other name gets a colour of
  :data:`FALLBACK_COLOURS` chosen by the CRC-32 of its name (the same in every process, unlike Python's salted
  ``hash``); two such names may share a colour, the legend tells them apart.
* **Line style: the engine.** Each engine of the lab (``model.quant.QUANT_MODES``) has a fixed dash pattern of
  :data:`ENGINE_DASHES`: the exact engine ``none`` (the control) dotted, ``e4m3`` solid, ``nvfp4`` dashed, ``e5m2``
  dash-dot, ...; any other engine (``+router``, ``tempX``) a pattern of :data:`FALLBACK_DASHES` by CRC-32.
* **Markers: the method's shape, hollow for ``+r3``.** A ``+r3`` run is drawn in its method's colour and engine's
  line with hollow markers of the method's shape along the line; on the frontier (one point per engine) every line
  has its method's markers, filled without R3 and hollow with it, and an R3 line is dashed.
* **Order.** Curves over rollouts are drawn and listed in the caller's order of runs (the report's); frontier lines
  in :func:`order_key` order: the methods of :data:`METHODS` in its order, then any other by name; each method
  without R3 before with it.
"""

from __future__ import annotations

import zlib
from typing import Any

from ..training.methods import REPLAY_SUFFIX

METHODS: dict[str, tuple[str, str]] = {
    "grpo": ("#1f77b4", "o"),
    "dcgrpo": ("#d62728", "s"),
    "token_tis": ("#2ca02c", "^"),
    "geo_mis": ("#9467bd", "v"),
    "icepop": ("#8c564b", "D"),
    "length_decay": ("#e377c2", "P"),
    "seq_mis": ("#bcbd22", "X"),
    "acrl": ("#17becf", "h"),
    "dcgrpo_length_decay": ("#ff7f0e", "p"),
    "dcgrpo_paper": ("#843c39", "s"),
    "geo_rs_e4m3": ("#7b4173", "v"),
    "geo_rs_e5m2": ("#54278f", "<"),
    "dcgrpo_floor_guard": ("#393b79", ">"),
    "dcgrpo_drift": ("#637939", "d"),
    "dcgrpo_drift_skip": ("#8c6d31", "*"),
    "dcgrpo_cap1": ("#1b9e77", "o"),
    "dcgrpo_cap025": ("#e6ab02", "^"),
    "dcgrpo_cap005": ("#5254a3", "v"),
    "dcgrpo_persistent": ("#d95f02", "D"),
    "dcgrpo_centered_persistent": ("#e7298a", "P"),
    "dcgrpo_tight_noguard": ("#666666", "X"),
    "dcgrpo_tight_guard": ("#8ca252", "h"),
    "dcgrpo_centered": ("#ad494a", "p"),
    "geo_rs_nvfp4": ("#3f007d", ">"),
    "grpo_lr_half": ("#6baed6", "o"),
}
"""Method -> (colour, marker) of every method the lab ships; the order is the frontier's legend order."""

FALLBACK_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#9c755f", "#76b7b2", "#edc948", "#ff9da7",
                    "#e15759", "#3b3b3b")
"""Colours for any other method, by the CRC-32 of its name: Tableau 10 of 2016 (its light grey darkened), none of
them in :data:`METHODS`."""

FALLBACK_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "h")
"""Markers for any other method, by the CRC-32 of its name."""

ENGINE_DASHES: dict[str, Any] = {
    "none": (0, (1, 1.2)),
    "e4m3": "-",
    "nvfp4": (0, (5, 2)),
    "e5m2": (0, (6, 2, 1, 2)),
    "mxfp4": (0, (2, 1.5)),
    "int4": (0, (6, 1.5, 1, 1.5, 1, 1.5)),
    "bf16": (0, (10, 3)),
    "fp16": (0, (10, 3, 2, 3)),
    "e4m3-w": (0, (8, 2, 2, 2)),
    "e5m2-w": (0, (4, 2, 4, 2, 1, 2)),
}
"""Engine -> matplotlib line style of every engine of ``QUANT_MODES``; the exact engine dotted."""

FALLBACK_DASHES = ((0, (3, 3)), (0, (8, 2, 1, 2, 1, 2, 1, 2)), (0, (2, 4)), (0, (12, 2, 2, 2)),
                   (0, (4, 1, 1, 1, 1, 1)), (0, (1, 2, 4, 2)), (0, (7, 4)), (0, (3, 1, 3, 1, 1, 3)))
"""Line styles for any other engine (``e4m3+router``, ``temp1.3``), by the CRC-32 of its name."""

WIDTH = 1.6
"""Line width of every run's curve and every frontier line."""
R3_SPACING = 0.06
"""Distance between the markers of a ``+r3`` curve, as a fraction of the axes' diagonal."""


def parse(label: str) -> tuple[str, str | None, bool]:
    """(method, engine or None, replay) of ``METHOD[@ENGINE][+r3]``; the engine may itself hold ``+`` suffixes
    (``nvfp4+router``)."""
    replay = label.endswith(REPLAY_SUFFIX)
    method, at, engine = label.removesuffix(REPLAY_SUFFIX).partition("@")
    return method, engine if at else None, replay


def _pick(name: str, options: tuple[Any, ...], salt: str = "") -> Any:
    return options[zlib.crc32(f"{salt}{name}".encode()) % len(options)]


def colour(method: str) -> str:
    """The method's colour: its entry of :data:`METHODS`, else one of :data:`FALLBACK_COLOURS` by CRC-32."""
    return METHODS[method][0] if method in METHODS else _pick(method, FALLBACK_COLOURS)


def marker(method: str) -> str:
    """The method's marker: its entry of :data:`METHODS`, else one of :data:`FALLBACK_MARKERS` by CRC-32."""
    return METHODS[method][1] if method in METHODS else _pick(method, FALLBACK_MARKERS, "marker:")


def dashes(engine: str | None) -> Any:
    """The engine's line style: its entry of :data:`ENGINE_DASHES`, else one of :data:`FALLBACK_DASHES` by CRC-32;
    solid without an engine."""
    if engine is None:
        return "-"
    return ENGINE_DASHES[engine] if engine in ENGINE_DASHES else _pick(engine, FALLBACK_DASHES)


def run_style(label: str) -> dict[str, Any]:
    """Keyword arguments of ``Axes.plot`` for a run's curve over rollouts: method colour, engine line style, hollow
    method markers along the line for ``+r3``."""
    method, engine, replay = parse(label)
    style = {"color": colour(method), "ls": dashes(engine), "lw": WIDTH}
    if replay:
        style |= {"marker": marker(method), "ms": 5, "mfc": "white", "markevery": R3_SPACING}
    return style


def line_style(line: str) -> dict[str, Any]:
    """Keyword arguments of ``Axes.plot`` / ``errorbar`` for a frontier line (``METHOD[+r3]``): method colour and
    marker, filled and solid without R3, hollow and dashed with it."""
    method, _, replay = parse(line)
    return {"color": colour(method), "marker": marker(method), "ms": 6, "lw": WIDTH, "ls": "--" if replay else "-",
            "mfc": "white" if replay else colour(method), "mew": 1.4}


def order_key(label: str) -> tuple[int, str, bool, str]:
    """Canonical order of runs or lines: methods in :data:`METHODS` order then any other by name, without R3 before
    with it, then by engine name."""
    method, engine, replay = parse(label)
    rank = list(METHODS).index(method) if method in METHODS else len(METHODS)
    return rank, method, replay, engine or ""


def legend_note(labels: list[str]) -> str:
    """The rule in one line, for the legend of the runs ``labels``: only what those runs show (the line style only
    when they span several engines, ``dotted: exact`` only with the exact engine, hollow markers only with a ``+r3``
    run)."""
    parsed = [parse(label) for label in labels]
    engines = {engine for _, engine, _ in parsed}
    parts = ["colour: method"]
    if len(engines) > 1:
        parts.append("line: engine" + (" (dotted: exact)" if "none" in engines else ""))
    if any(replay for *_, replay in parsed):
        parts.append("hollow markers: +r3")
    return ", ".join(parts)


def line_note(lines: list[str]) -> str:
    """The rule for the frontier lines ``lines`` in one line: hollow and dashed only named with a ``+r3`` line."""
    return "colour, marker: method" + ("; hollow, dashed: +r3" if any(parse(line)[2] for line in lines) else "")


def new_figure(dpi: int, **kwargs: Any) -> Any:
    """A matplotlib ``Figure`` of ``dpi`` on its own Agg canvas: no pyplot (no global state, nothing to close), so
    ``fig.canvas.draw()`` measures text as the saved PNG shows it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(dpi=dpi, **kwargs)
    FigureCanvasAgg(fig)
    return fig
