"""analyze's plots: smoothing only where there are many rollouts, and no panel that says nothing (a preset that never
rejects, a run where nothing rejects)."""

import copy

import pytest
import torch

from mismatch_ctrl.analyze import AnalyzeOptions, analyze_dumps
from mismatch_ctrl.analyze.report import smoothing_window, write_plots

from .synthetic import make_rollout, write_run


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dumps")
    g = torch.Generator().manual_seed(5)
    write_run(directory, [make_rollout(i, g, samples=6, noise=0.03) for i in range(6)])
    return analyze_dumps(directory, AnalyzeOptions(architecture="dense", progress=False))


def test_smoothing_window_grows_with_the_rollouts_and_is_capped():
    assert [smoothing_window(n) for n in (1, 39, 40, 100, 199, 200, 5000)] == [1, 1, 2, 5, 9, 10, 10]


def test_rejection_plot_leaves_out_what_never_rejects(result, tmp_path):
    names = {p.name for p in write_plots(result, tmp_path / "all")}
    assert {"discrepancy.png", "lambda.png", "prob_diff_quantiles.png", "response_length.png", "rejection.png"} <= names
    quiet = copy.deepcopy(result)
    for r in quiet["rollouts"]:
        for preset in r.get("rejection", {}).values():
            preset["tokens"] = preset["sequences"] = 0.0
    names = {p.name for p in write_plots(quiet, tmp_path / "quiet")}
    assert "rejection.png" not in names and "discrepancy.png" in names
