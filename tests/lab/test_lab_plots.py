"""The plots' look: a run's style depends on its label alone (not on the other runs or their order), two renders of
the same runs are the same PNG bytes, the frontier's points sit at their engine's x, and the engines' names on the
frontier's top axis never overprint. The figures are read back as they are saved (``Figure.savefig`` recorded)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure

from mismatch_ctrl.lab.model.quant import QUANT_MODES
from mismatch_ctrl.lab.results import style
from mismatch_ctrl.lab.results.frontier_plot import write_frontier_plot, x_positions
from mismatch_ctrl.lab.results.plots import write_plots
from mismatch_ctrl.lab.results.stats import spread
from mismatch_ctrl.lab.training.methods import method_names

LABELS = ("grpo@none", "grpo@e4m3", "dcgrpo@e4m3", "token_tis@e4m3", "grpo@e4m3+r3", "my_method@nvfp4")


def recording(patch: pytest.MonkeyPatch) -> list:
    """Every figure saved from now on (until ``patch`` is undone), in order."""
    figures = []
    save = Figure.savefig

    def record(fig, *args, **kwargs):
        figures.append(fig)
        return save(fig, *args, **kwargs)

    patch.setattr(Figure, "savefig", record)
    return figures


@pytest.fixture
def saved(monkeypatch):
    return recording(monkeypatch)


def records(k: int, flips: bool) -> list[dict]:
    rows = [{"step": s, "reward": 0.1 * s + 0.01 * k, "discrepancy": 0.01 + 0.001 * k if flips else 1e-7,
             "routing_flip_fraction": 0.05 + 0.01 * k if flips else 0.0, "response_length": 4.0 + s % 3 + k,
             "discrepancy_flipped": 0.05 if flips else None, "discrepancy_unflipped": 0.01 if flips else 1e-7,
             **({"eval_acc_engine": 0.5} if s == 0 else {})} for s in range(6)]
    rows[-1]["final_eval_acc_engine"] = 0.6 + 0.01 * k
    return rows


def lab(labels: tuple[str, ...]) -> dict:
    return {label: {seed: records(LABELS.index(label) + seed, "@none" not in label) for seed in (0, 1)}
            for label in labels}


def drawn_styles(figures: list) -> dict[str, set]:
    """Run label -> the (colour, line style, marker) of every curve, legend entry and per-run mean drawn for it."""
    out: dict[str, set] = {}

    def add(text: str, line) -> None:
        label = text.split(" (")[0].split(",")[0]
        if label in LABELS:
            out.setdefault(label, set()).add((to_hex(line.get_color()), line.get_linestyle(), line.get_marker()))

    for fig in figures:
        for ax in fig.axes:
            for line in ax.get_lines():
                add(line.get_label(), line)
            legend = ax.get_legend()
            if legend is not None:
                for handle, text in zip(legend.legend_handles, legend.get_texts()):
                    add(text.get_text(), handle)
            if ax.get_title() and not ax.get_legend_handles_labels()[0] and ax.get_lines():
                add(ax.get_title(), ax.get_lines()[-1])  # a per-run panel: the run's mean is drawn last
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The plots of ``LABELS``: their paths and figures."""
    with pytest.MonkeyPatch.context() as patch:
        figures = recording(patch)
        return write_plots(lab(LABELS), tmp_path_factory.mktemp("plots")), figures


def test_a_runs_style_depends_on_its_label_alone(tmp_path, saved, rendered):
    found = [drawn_styles(rendered[1])]
    for i, labels in enumerate([tuple(reversed(LABELS)), ("my_method@nvfp4", "token_tis@e4m3", "grpo@e4m3")]):
        start = len(saved)
        write_plots(lab(labels), tmp_path / str(i))
        found.append(drawn_styles(saved[start:]))
        assert set(found[-1]) == set(labels)
    for label in LABELS:
        assert all(len(f[label]) == 1 for f in found if label in f), label  # one style in every plot
        assert len({next(iter(f[label])) for f in found if label in f}) == 1, label  # whichever runs are shown
    looks = {label: next(iter(found[0][label])) for label in LABELS}
    assert len({looks[label][0] for label in ("grpo@e4m3", "grpo@none", "grpo@e4m3+r3")}) == 1  # colour: method
    assert len({looks[label][0] for label in ("grpo@e4m3", "dcgrpo@e4m3", "token_tis@e4m3")}) == 3
    assert looks["grpo@none"][1:] != looks["grpo@e4m3"][1:] != looks["grpo@e4m3+r3"][1:]
    assert looks["grpo@e4m3"][0] == style.METHODS["grpo"][0] and looks["dcgrpo@e4m3"][0] == style.METHODS["dcgrpo"][0]


def test_legends_list_runs_in_the_callers_order(rendered):
    listed = 0
    for fig in rendered[1]:
        for legend in filter(None, (ax.get_legend() for ax in fig.axes)):
            runs = [t.get_text().split(" ")[0].rstrip(",") for t in legend.get_texts()]
            assert runs == sorted(runs, key=LABELS.index)  # the far-below strip's runs too (grpo@none first)
            listed += len(runs)
    assert listed > 20


def test_two_renders_of_the_same_runs_are_the_same_bytes(tmp_path, rendered):
    first = rendered[0]
    second = write_plots(lab(LABELS), tmp_path)
    assert [p.name for p in first] == [p.name for p in second] and len(first) > 5
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(first, second))


def gap(mean: float, half: float) -> object:
    return spread([mean - half, mean + half])


def found_of(doses: dict[str, float], lines: list[str]) -> dict:
    """A frontier (the shape ``frontier.frontier`` returns) of every line on every engine, against ``grpo@none``."""
    points = []
    for (dose, _), line in itertools.product(doses.items(), lines):
        label = f"{line.removesuffix('+r3')}@{dose}" + ("+r3" if line.endswith("+r3") else "")
        shift = 0.01 * (lines.index(line) + 1) * (list(doses).index(dose) + 1)
        reference = None if label == "grpo@none" else "grpo@none"
        points.append({"line": line, "dose": dose, "label": label, "reference": reference,
                       "gaps": {key: gap(-shift, 0.2) if reference else None
                                for key in ("late_acc_engine", "late_acc_fp32", "late_reward")},
                       "seeds": 2, "collapse_rate": 0.5 * (lines.index(line) % 2)})
    return {"doses": {dose: spread([v]) for dose, v in doses.items()}, "points": points}


DOSES = {"none": 1e-7, "e4m3": 0.011, "nvfp4": 0.05}


def test_frontier_points_sit_at_their_engines_x(tmp_path, saved):
    found = found_of(DOSES, ["grpo", "dcgrpo", "token_tis", "grpo+r3"])
    write_frontier_plot(found, tmp_path / "f.png")
    x, broken = x_positions(found["doses"])
    assert broken
    checked = 0
    for ax in saved[-1].axes:
        for container in ax.containers:
            if isinstance(container, ErrorbarContainer):
                line = container.get_label()
                want = [x[p["dose"]] for p in found["points"] if p["line"] == line and p["reference"]]
                assert list(container.lines[0].get_xdata()) == want
                checked += 1
        for drawn in ax.get_lines():
            if drawn.get_label() in {"grpo", "dcgrpo", "token_tis", "grpo+r3"}:
                assert list(drawn.get_xdata()) == [x[p["dose"]] for p in found["points"]
                                                   if p["line"] == drawn.get_label()]
                checked += 1
    assert checked == 3 * 4  # three gap panels, four lines each (the collapse table: test_lab_plots_glance.py)


def test_frontier_lines_do_not_depend_on_the_order_of_the_points(tmp_path, saved):
    found = found_of(DOSES, ["grpo", "dcgrpo", "token_tis", "grpo+r3"])
    shuffled = {**found, "points": sorted(found["points"], key=lambda p: (list(DOSES).index(p["dose"]), p["line"]))}
    first = write_frontier_plot(found, tmp_path / "a.png")
    second = write_frontier_plot(shuffled, tmp_path / "b.png")
    assert first.read_bytes() == second.read_bytes()
    again = write_frontier_plot(found, tmp_path / "c.png")
    assert first.read_bytes() == again.read_bytes()
    legend = saved[-1].axes[-1].get_legend()  # beside the collapse table, the gap panels' lines
    colours = {t.get_text(): to_hex(h.get_color()) for h, t in zip(legend.legend_handles, legend.get_texts())}
    assert colours["grpo"] == colours["grpo+r3"] == style.METHODS["grpo"][0] != colours["dcgrpo"]


CLOSE = {"none": 1e-7, "bf16": 4e-4, "e5m2-w": 2e-3, "e4m3": 0.0110, "int4": 0.0111, "temp1.3": 0.0112,
         "nvfp4": 0.045}
"""Seven engines, three of them within 2% of each other."""


@pytest.mark.parametrize("doses", [CLOSE, {**CLOSE, "none": 5e-3, "bf16": 7e-3, "e5m2-w": 0.0135},
                                   {"none": 0.0, "e4m3": 0.0, "e5m2": 0.0}],
                         ids=["broken-axis", "log-axis", "all-at-zero"])
def test_engine_names_on_the_top_axis_never_overprint(tmp_path, saved, doses):
    write_frontier_plot(found_of(doses, ["grpo", "dcgrpo"]), tmp_path / "f.png")
    fig = saved[-1]
    fig.canvas.draw()
    def shown(ax):
        return [t for top in ax.child_axes for t in top.get_xticklabels() if t.get_visible() and t.get_text()]

    panels = [ax for ax in fig.axes if ax.child_axes]
    assert len(panels) == 3
    for ax in panels:  # every engine is named on every panel
        assert sorted(" / ".join(t.get_text().split("\n")[0] for t in shown(ax)).split(" / ")) == sorted(doses)
    labels = [t for ax in panels for t in shown(ax)]
    boxes = [t.get_window_extent() for t in labels]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    assert all(t.get_rotation() == 0 for t in labels)  # horizontal: read without tilting the head


def test_style_rule():
    assert style.parse("grpo@nvfp4+router+r3") == ("grpo", "nvfp4+router", True)
    assert style.parse("dcgrpo+r3") == ("dcgrpo", None, True) and style.parse("grpo@none") == ("grpo", "none", False)
    shipped = method_names()
    assert set(shipped) <= set(style.METHODS)  # every method the lab ships has its own fixed colour
    colours = [style.METHODS[m][0] for m in shipped]
    assert len(set(colours)) == len(colours) and not set(colours) & set(style.FALLBACK_COLOURS)
    engines = [style.ENGINE_DASHES[e] for e in QUANT_MODES]
    assert len({str(d) for d in engines}) == len(engines)
    assert not {str(d) for d in engines} & {str(d) for d in style.FALLBACK_DASHES}
    r3 = style.run_style("grpo@e4m3+r3")
    assert r3["color"] == style.run_style("grpo@none")["color"] and r3["mfc"] == "white" and "marker" in r3
    assert "marker" not in style.run_style("grpo@e4m3") and style.run_style("grpo@none")["ls"] != "-"
    assert style.run_style("grpo@e4m3+router")["ls"] in style.FALLBACK_DASHES
    lines = ["zz", "grpo+r3", "token_tis", "aa", "grpo", "dcgrpo"]
    assert sorted(lines, key=style.order_key) == ["grpo", "grpo+r3", "dcgrpo", "token_tis", "aa", "zz"]


def test_an_unknown_method_or_engine_gets_the_same_style_in_every_process():
    code = "from mismatch_ctrl.lab.results.style import run_style; print(run_style('my_new_method@e4m3+temp1.2+r3'))"
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    here = style.run_style("my_new_method@e4m3+temp1.2+r3")
    assert outputs == {f"{here}\n"} and here["color"] in style.FALLBACK_COLOURS
