"""benchmarks/lab_pooled.py and lab_interaction.py on bad input (issue 23, item 3): a directory given twice or a
seed trained with the same settings in two directories is refused (it would count twice in a pooled interval), and
a malformed summary.json is named with its field, never a traceback."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # lab_interaction imports lab_pooled from its own directory


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lab_pooled, lab_interaction = _load("lab_pooled"), _load("lab_interaction")


def summary(setting: str, seeds: tuple[int, ...]) -> dict[str, Any]:
    """A summary.json as the lab writes it (the fields both scripts read): dc@e5m2 and grpo@e5m2 per seed."""
    runs = [{"label": f"{method}@e5m2", "method": method, "quant": "e5m2", "replay": False, "seed": seed,
             "settings": {"optimizer_steps": setting, "seed": seed}, "collapse_step": None,
             "late_acc_engine": 0.5 + 0.1 * seed + (0.05 if method == "dc" else 0.0), "late_reward": 0.4}
            for method in ("dc", "grpo") for seed in seeds]
    versus = [{"run": "dc@e5m2", "reference": "grpo@e5m2", "quantity": "late_acc_engine",
               "difference": {"values": [0.05] * len(seeds)}}]
    return {"runs": runs, "versus_grpo": versus,
            "aggregate": {"dc@e5m2": {"collapses": 0}, "grpo@e5m2": {"collapses": 1}}}


def write(directory: Path, content: dict[str, Any] | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(content if isinstance(content, str) else json.dumps(content))
    return directory


def refused(main: Callable[[list[str]], int], *directories: Path | str) -> str:
    with pytest.raises(SystemExit) as stop:
        main([str(d) for d in directories])
    assert isinstance(stop.value.code, str), stop.value.code
    return stop.value.code


def test_a_directory_given_twice_is_refused_however_it_is_spelled(tmp_path, monkeypatch):
    a = write(tmp_path / "a", summary("1", (0, 1)))
    b = write(tmp_path / "b", summary("4", (0, 1)))
    (tmp_path / "link").symlink_to(a)
    monkeypatch.chdir(tmp_path)
    for again in (a, f"{a}/", "./a", tmp_path / "link", tmp_path / "b" / ".." / "a"):
        assert f"is given twice (also as {a})" in refused(lab_pooled.main, a, again)
        assert "is given twice" in refused(lab_interaction.main, a, b, again, b)


def test_a_seed_with_the_same_settings_in_two_directories_is_refused(tmp_path):
    a = write(tmp_path / "a", summary("1", (0, 1)))
    b = write(tmp_path / "b", summary("4", (0, 1)))
    copy = tmp_path / "copy-of-a"
    shutil.copytree(a, copy)
    message = refused(lab_pooled.main, a, copy)
    assert f"{a} and {copy} both hold seed 0 trained with the same settings" in message
    b2 = write(tmp_path / "b2", summary("4", (2, 3)))
    assert "both hold seed 0 trained with the same settings" in refused(lab_interaction.main, a, b, copy, b2)
    assert f"{a} and {copy} both hold seed 0" in refused(lab_interaction.main, a, copy)  # A = B: no setting changed
    write(tmp_path / "c", summary("1", (2, 3)))
    assert lab_pooled.main([str(a), str(tmp_path / "c")]) == 0  # other seeds: pooled


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


MALFORMED = {
    "no quantity": (lambda d: d["versus_grpo"][0].pop("quantity"), "versus_grpo[0]: expected a table"),
    "difference null": (_set(("versus_grpo", 0, "difference"), None), "versus_grpo[0].difference.values = None"),
    "no values": (_set(("versus_grpo", 0, "difference", "values"), []), "versus_grpo[0].difference.values = []"),
    "a value that is text": (_set(("versus_grpo", 0, "difference", "values"), ["x"]), "difference.values = ['x']"),
    "a NaN value": (_set(("versus_grpo", 0, "difference", "values"), [float("nan")]), "difference.values = [nan]"),
    "run missing from aggregate": (lambda d: d["aggregate"].pop("grpo@e5m2"),
                                   "versus_grpo[0].reference = 'grpo@e5m2': not a run of the runs and aggregate"),
    "run missing from runs": (lambda d: d.update(runs=[r for r in d["runs"] if r["label"] != "grpo@e5m2"]),
                              "versus_grpo[0].reference = 'grpo@e5m2': not a run of the runs and aggregate"),
    "collapses as text": (_set(("aggregate", "dc@e5m2", "collapses"), "2"), "aggregate['dc@e5m2'].collapses"),
    "aggregate entry a number": (_set(("aggregate", "dc@e5m2"), 3), "aggregate['dc@e5m2'].collapses"),
    "runs a table": (_set(("runs",), {"a": 1}), "runs and versus_grpo must be lists"),
    "versus a table": (_set(("versus_grpo",), {"a": 1}), "runs and versus_grpo must be lists"),
    "a run a number": (_set(("runs", 0), 5), "runs[0] = 5: expected a table"),
    "seed as text": (_set(("runs", 0, "seed"), "0"), "runs[0].seed = '0': expected an integer >= 0"),
    "negative seed": (_set(("runs", 0, "seed"), -1), "runs[0].seed = -1"),
    "seed true": (_set(("runs", 0, "seed"), True), "runs[0].seed = True"),
    "settings null": (_set(("runs", 0, "settings"), None), "runs[0].settings = None: expected a dict"),
    "label a number": (_set(("runs", 0, "label"), 7), "runs[0].label = 7: expected a str"),
    "accuracy as text": (_set(("runs", 1, "late_acc_engine"), "high"), "runs[1].late_acc_engine = 'high'"),
    "accuracy infinite": (_set(("runs", 1, "late_acc_engine"), float("inf")), "runs[1].late_acc_engine = inf"),
    "collapse step as text": (_set(("runs", 0, "collapse_step"), "7"), "runs[0].collapse_step = '7'"),
    "a run listed twice": (lambda d: d["runs"].append(dict(d["runs"][0])),
                           "runs[4]: run 'dc@e5m2' seed 0 is listed twice"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_summary_is_named_with_its_field(tmp_path, case):
    change, needle = MALFORMED[case]
    data = summary("1", (0, 1))
    change(data)
    a = write(tmp_path / "a", data)
    b = write(tmp_path / "b", summary("4", (0, 1)))
    for main, directories in ((lab_pooled.main, (a,)), (lab_interaction.main, (a, b))):
        message = refused(main, *directories)
        assert f"{a / 'summary.json'}: " in message and needle in message, message
        assert "mismatch-ctrl lab --report-only" in message


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000, '{"runs": ' + "[" * 50_000 + "]" * 50_000 + "}",
                                     "\ufeff{}", "null", '"text"'])
def test_hostile_json_is_not_a_lab_summary(tmp_path, content):
    a = write(tmp_path / "a", content)
    for main, directories in ((lab_pooled.main, (a,)), (lab_interaction.main, (a, a.parent / "b"))):
        assert f"{a / 'summary.json'}: not a lab summary" in refused(main, *directories)
