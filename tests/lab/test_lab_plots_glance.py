"""Plots read at a glance, measured on the figures as saved: titles and legends name only what is drawn (the DC-GRPO
eps line, the min-max band, the parts of the style rule), runs of one method on several engines differ in line style
or markers and the legend says which, the overview colours by method like every other plot; on the frontier the
engines' names never overprint for any shipped preset's engines, the error bars of one engine stand apart, and the
collapsed seeds are a table whose every count shows."""

from __future__ import annotations

import itertools
import random

import pytest
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer

from mismatch_ctrl.lab.results import style
from mismatch_ctrl.lab.results.frontier_plot import BAR, DODGE, write_frontier_plot
from mismatch_ctrl.lab.results.plots import write_plots
from mismatch_ctrl.lab.sweeps.options import LAB_DEFAULTS, LAB_PRESETS
from mismatch_ctrl.lab.training.methods import RunSpec

from test_lab_plots import found_of, records, recording


@pytest.fixture
def saved(monkeypatch):
    return recording(monkeypatch)


def lab(labels: tuple[str, ...], seeds: tuple[int, ...] = (0,)) -> dict:
    return {label: {seed: records(i + seed, "@none" not in label) for seed in seeds}
            for i, label in enumerate(labels)}


def named(figures: list, tmp_path, runs: dict) -> dict:
    """File stem -> figure of ``write_plots(runs)``."""
    start = len(figures)
    paths = write_plots(runs, tmp_path)
    return {path.stem: fig for path, fig in zip(paths, figures[start:])}


def bands(fig) -> int:
    return sum(isinstance(c, PolyCollection) for ax in fig.axes for c in ax.collections)


def dashes(line) -> tuple:
    """A line's dash pattern as drawn (``get_linestyle`` says ``--`` for every custom pattern)."""
    offset, pattern = line._unscaled_dash_pattern  # pinned matplotlib (constraints.txt): no public getter
    return float(offset), tuple(pattern or ())


def legend_title(fig) -> str:
    return next(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None).get_title().get_text()


def test_the_eps_line_is_named_only_where_one_is_drawn(tmp_path, saved):
    without = named(saved, tmp_path / "a", lab(("grpo@none", "grpo@e4m3", "token_tis@e4m3")))
    assert "eps" not in without["discrepancy"].axes[0].get_title()
    assert all("eps" not in ax.get_title() for ax in without["overview"].axes)
    runs = lab(("grpo@e4m3", "dcgrpo@e4m3"))
    for rows in runs["dcgrpo@e4m3"].values():
        for row in rows:
            row.update(eps=0.012, lambda_next=0.1, **{"lambda": 0.1})
    with_eps = named(saved, tmp_path / "b", runs)
    ax = with_eps["discrepancy"].axes[0]
    wide = [line for line in ax.get_lines() if line.get_linewidth() == 5]
    assert len(wide) == 1 and to_hex(wide[0].get_color()) == style.colour("dcgrpo")
    assert "wide faint: DC-GRPO eps" in ax.get_title()


@pytest.mark.parametrize("labels, seeds", [(("grpo@none", "grpo@e4m3"), (0,)), (("grpo@none", "grpo@e4m3"), (0, 1)),
                                           (("grpo@none", "grpo@e4m3", "token_tis@e4m3"), (0, 1))])
def test_a_band_is_named_only_where_one_is_drawn(tmp_path, saved, labels, seeds):
    figures = named(saved, tmp_path, lab(labels, seeds))
    for stem, fig in figures.items():
        if stem.endswith("_by_run"):
            continue
        title = legend_title(fig)
        assert ("min-max" in title) == (bands(fig) > 0), (stem, title)
        assert "<=" not in title  # no cryptic rule
    overview = legend_title(figures["overview"])
    assert overview.startswith("one seed per run" if len(seeds) == 1 else "mean over seeds")
    assert (bands(figures["reward"]) > 0) == (len(seeds) > 1 and len(labels) <= 2)


def test_the_style_rule_in_a_legend_names_only_what_its_runs_use():
    assert style.legend_note(["grpo@e4m3", "dcgrpo@e4m3"]) == "colour: method"
    assert style.legend_note(["grpo@e4m3", "grpo@nvfp4"]) == "colour: method, line: engine"
    assert style.legend_note(["grpo@none", "grpo@e4m3+r3"]) == ("colour: method, line: engine (dotted: exact), "
                                                               "hollow markers: +r3")
    assert style.line_note(["grpo", "dcgrpo"]) == "colour, marker: method"
    assert style.line_note(["grpo", "grpo+r3"]) == "colour, marker: method; hollow, dashed: +r3"


GRPO_RUNS = ("grpo@none", "grpo@e4m3", "grpo@e4m3+r3", "grpo@nvfp4", "dcgrpo@e4m3")


def test_runs_of_one_method_on_several_engines_differ_at_a_glance(tmp_path, saved):
    """In reward.png and response_length.png every GRPO run has GRPO's colour and its own (line style, marker): no
    two look alike; the legend names each run and the rule; the faint raw curve keeps the run's line style; the
    overview draws each run in the same colour (by method) and style as these."""
    figures = named(saved, tmp_path, lab(GRPO_RUNS))
    looks = {}
    for stem in ("reward", "response_length", "overview"):
        fig = figures[stem]
        legend = next(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)
        texts = [t.get_text() for t in legend.get_texts()]
        assert texts == list(GRPO_RUNS)
        assert "line: engine (dotted: exact)" in legend.get_title().get_text()
        assert "hollow markers: +r3" in legend.get_title().get_text()
        looks[stem] = {text: (to_hex(h.get_color()), dashes(h), h.get_marker())
                       for text, h in zip(texts, legend.legend_handles)}
    assert looks["reward"] == looks["response_length"] == looks["overview"]
    grpo = [looks["reward"][label] for label in GRPO_RUNS if label.startswith("grpo@")]
    assert {colour for colour, *_ in grpo} == {style.colour("grpo")} != {looks["reward"]["dcgrpo@e4m3"][0]}
    assert len({tuple(rest) for _, *rest in grpo}) == len(grpo)  # line style or marker: each engine its own
    ax = figures["reward"].axes[0]
    faint = [line for line in ax.get_lines() if line.get_alpha() == 0.3]
    main = {line.get_label(): line for line in ax.get_lines() if line.get_label() in GRPO_RUNS}
    assert len(faint) == len(GRPO_RUNS)
    assert sorted(map(dashes, faint)) == sorted(map(dashes, main.values()))


def preset_engines() -> dict[str, tuple[str, ...]]:
    """Each shipped preset's engines (the frontier's doses: every run's engine), by ``lab --preset``'s expansion."""
    out = {}
    for name, preset in LAB_PRESETS.items():
        settings = {**LAB_DEFAULTS, **preset}
        runs = RunSpec.expand(settings["methods"].split(","), settings["quant"].split(","), num_experts=4)
        out[name] = tuple(sorted({run.quant for run in runs}))
    return out


MEASURED = {"none": 7.5e-8, "temp1.003": 5e-4, "e4m3": 0.013, "int4": 0.023, "e5m2": 0.026, "nvfp4": 0.049,
            "temp1.3": 0.054, "mxfp4": 0.06, "bf16+train-bf16": 8e-4, "fp16+train-fp16": 1e-4,
            "e4m3+train-bf16": 0.013, "nvfp4+train-bf16": 0.049}
"""Early C_bar of each engine about as measured (docs/lab-frontier.md; the precision engines: docs/lab-precision.md's
ratios to e4m3)."""


def placements(engines: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Ways an engine set's C_bar may fall: as measured, crowded (every engine but the exact one within 1%), and
    log-uniform at random."""
    rng = random.Random(",".join(engines))
    quantised = [e for e in engines if e != "none"]
    return {"measured": {e: MEASURED[e] for e in engines},
            "crowded": {"none": 7.5e-8, **{e: 0.02 * (1 + 0.002 * i) for i, e in enumerate(quantised)}},
            "random": {"none": 7.5e-8, **{e: 10 ** rng.uniform(-4, -1) for e in quantised}}}


ENGINE_SETS = sorted(set(preset_engines().values()), key=len)
CASES = [(engines, "measured") for engines in ENGINE_SETS] + [(ENGINE_SETS[-1], how) for how in ("crowded", "random")]
"""Every preset's engines as measured; the largest set (the frontier's) crowded and at random too (a render with its
label layout takes seconds)."""


def test_every_preset_is_covered():
    assert {engines for engines, _ in CASES} == set(preset_engines().values())
    assert set(ENGINE_SETS[-1]) == set(preset_engines()["frontier"])
    assert all(set(engines) <= set(MEASURED) for engines in preset_engines().values())


def labels_of(fig) -> list:
    return [t for ax in fig.axes for top in ax.child_axes for t in top.get_xticklabels()
            if t.get_visible() and t.get_text()]


@pytest.mark.parametrize("engines, how", CASES, ids=[f"{'+'.join(e)}-{h}" for e, h in CASES])
def test_engine_names_never_overprint_for_any_presets_engines(tmp_path, saved, engines, how):
    doses = placements(engines)[how]
    write_frontier_plot(found_of(doses, ["grpo", "dcgrpo"]), tmp_path / "f.png")
    fig = saved[-1]
    fig.canvas.draw()
    labels = labels_of(fig)
    named_engines = sorted(name.split("\n")[0] for t in labels for name in t.get_text().split(" / "))
    assert named_engines == sorted(list(engines) * 3)  # every engine named once on each of the three gap panels
    for a, b in itertools.combinations([t.get_window_extent() for t in labels], 2):
        assert not a.overlaps(b), (a, b)


FRONTIER_LINES = ["grpo", "token_tis", "icepop", "geo_rs_e4m3", "grpo+r3", "dcgrpo", "length_decay"]


def test_the_error_bars_of_one_engine_stand_apart(tmp_path, saved):
    """Seven lines at each engine (the frontier preset): on the rendered figure the bars of one engine are at least
    a dodge step apart, and thinner than it, with caps narrower than it (no two touch)."""
    doses = {e: MEASURED[e] for e in preset_engines()["frontier"]}
    write_frontier_plot(found_of(doses, FRONTIER_LINES), tmp_path / "f.png")
    fig = saved[-1]
    fig.canvas.draw()
    step = DODGE * fig.dpi / 72
    assert 2 * BAR["capsize"] < DODGE and BAR["elinewidth"] < DODGE / 2
    panels = 0
    for ax in fig.axes:
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        if not bars:
            continue
        panels += 1
        at: dict[float, list[float]] = {}
        for container in bars:
            (collection,) = [c for c in container.lines[2] if isinstance(c, LineCollection)]
            assert max(collection.get_linewidths()) == BAR["elinewidth"]
            transform = collection.get_transform()
            for segment in collection.get_segments():
                at.setdefault(float(segment[0][0]), []).append(transform.transform(segment[0])[0])
        n = len(FRONTIER_LINES)
        assert sorted(map(len, at.values())) == [n - 1] + [n] * (len(doses) - 1)  # grpo@none: the reference
        for xs in at.values():
            xs.sort()
            assert min(b - a for a, b in zip(xs, xs[1:])) >= 0.99 * step
    assert panels == 3


def test_the_collapsed_seeds_are_a_table_with_every_count(tmp_path, saved):
    doses = {e: MEASURED[e] for e in preset_engines()["frontier"]}
    found = found_of(doses, FRONTIER_LINES)
    rng = random.Random(0)
    for p in found["points"]:
        p["seeds"] = 5
        p["collapse_rate"] = rng.choice([0, 0, 0.2, 0.4, 1.0])
    write_frontier_plot(found, tmp_path / "f.png")
    ax = saved[-1].axes[3]
    order = sorted(doses, key=doses.get)
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows == sorted(FRONTIER_LINES, key=style.order_key)
    assert [t.get_text() for t in ax.get_xticklabels()] == order
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    want = {(rows.index(p["line"]), order.index(p["dose"])): f"{round(5 * p['collapse_rate'])}/5"
            for p in found["points"]}
    assert cells == want
    assert not ax.get_lines() and "nested" not in ax.get_title()
    colours = {t.get_text(): to_hex(t.get_color()) for t in ax.get_yticklabels()}
    assert colours == {line: style.colour(style.parse(line)[0]) for line in FRONTIER_LINES}


def _cielab(colour: str) -> tuple[float, float, float]:
    """sRGB hex -> CIE L*a*b* (D65), written out from the CIE formulas."""
    rgb = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    xyz = ((0.4124 * lin[0] + 0.3576 * lin[1] + 0.1805 * lin[2]) / 0.95047,
           0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2],
           (0.0193 * lin[0] + 0.1192 * lin[1] + 0.9505 * lin[2]) / 1.08883)
    f = [t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


@pytest.mark.parametrize("preset", sorted(LAB_PRESETS))
def test_the_methods_of_a_preset_have_colours_told_apart_at_a_glance(preset):
    """Two methods drawn together differ by a CIE76 colour difference of at least 20 (about where two line colours
    stop being mistaken for one; surge-compare once drew length decay and its Geo-RS 7 apart, pink beside pink)."""
    methods = {label.split("@")[0].removesuffix("+r3")
               for label in LAB_PRESETS[preset].get("methods", LAB_DEFAULTS["methods"]).split(",")}
    for a, b in itertools.combinations(sorted(methods), 2):
        difference = sum((p - q) ** 2 for p, q in zip(_cielab(style.colour(a)), _cielab(style.colour(b)))) ** 0.5
        assert difference >= 20, (preset, a, b, round(difference, 1))


def test_the_colour_difference_is_the_cie_one():
    """Reference points: white L* 100, black 0, sRGB red's L*a*b* (53.2, 80.1, 67.2)."""
    assert _cielab("#ffffff") == pytest.approx((100, 0, 0), abs=0.05)
    assert _cielab("#000000") == pytest.approx((0, 0, 0), abs=0.05)
    assert _cielab("#ff0000") == pytest.approx((53.24, 80.09, 67.20), abs=0.1)
