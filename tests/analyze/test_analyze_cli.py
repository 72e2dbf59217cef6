"""``mismatch-ctrl analyze``: report, plots and JSON carry the same numbers; errors exit 2 with a message."""

import json

import pytest
import torch

from mismatch_ctrl.analyze.dumps import samples_from_rollout_data, write_train_dump
from mismatch_ctrl.analyze.report import _pct
from mismatch_ctrl.cli import main
from mismatch_ctrl.formatting import fmt

from .synthetic import make_rollout, write_run


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dumps")
    g = torch.Generator().manual_seed(3)
    write_run(directory, [make_rollout(i, g, samples=6, noise=0.03) for i in range(12)])
    (directory / "train_data" / "12.pt").write_bytes(b"\x80\x04truncated")
    return directory


def test_report_plots_and_json_agree(dumps, tmp_path, capsys):
    out = tmp_path / "analysis"
    assert main(["analyze", str(dumps), "--out", str(out), "--json", "-", "--arch", "dense"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert f"report: {out / 'report.md'}" in captured.err
    report = (out / "report.md").read_text()
    assert {p.name for p in (out / "plots").iterdir()} == {"discrepancy.png", "lambda.png", "prob_diff_quantiles.png",
                                                          "rejection.png", "response_length.png"}
    assert result["counts"]["rollouts"] == 12 and result["method"]["architecture"] == "dense"
    assert [s["path"] for s in result["skipped"]] == [str(dumps / "train_data" / "12.pt")]
    assert "skipped `" + str(dumps / "train_data" / "12.pt") in report
    assert "1 dump file(s) or rollout(s) skipped, 12 rollout(s) measured" in captured.err  # said, not only reported
    rec = result["recommendation"]
    assert f"**eps = {fmt(rec['eps_auto'], 4)}**" in report
    for candidate in rec["candidates"]:
        row = f"| `{candidate['name']}` | {fmt(candidate['eps'], 4)} | {_pct(candidate['fraction_above'])} |"
        assert row in report
    replay = result["dcgrpo_replay"]
    assert f"C_bar exceeded eps in {_pct(replay['fraction_above_eps'])} of the rollouts" in report
    geo = result["presets"]["geo_mis"]
    assert f"| `geo_mis` | {_pct(geo['tokens_mean'])} / {_pct(geo['tokens_max'])} |" in report
    first = result["rollouts"][0]
    assert f"| 0 | 6 | {fmt(first['mean_response_length'])} | {_pct(first['truncation_rate'])} |" in report
    assert result["surge"]["verdict"] in report


@pytest.fixture
def no_plots(monkeypatch):
    """Skip the PNGs (about a second each run) in tests that check other outputs."""
    monkeypatch.setattr("mismatch_ctrl.analyze.report.write_plots", lambda result, out_dir: [])


def test_json_to_a_file_and_default_output_directory(dumps, tmp_path, capsys, no_plots):
    target = tmp_path / "new" / "folder" / "analysis.json"  # created, like --out
    assert main(["analyze", str(dumps), "--json", str(target), "--eps", "auto", "--lambda-0", "0.3"]) == 0
    assert (dumps / "analysis" / "report.md").is_file()
    result = json.loads(target.read_text())
    assert result["dcgrpo_replay"]["settings"]["eps"] == "auto"
    assert result["dcgrpo_replay"]["settings"]["lambda_0"] == 0.3
    assert result["dcgrpo_replay"]["eps_final"] == pytest.approx(result["recommendation"]["eps_auto"])


def test_errors_exit_2_with_a_message(tmp_path, capsys):
    assert main(["analyze", str(tmp_path)]) == 2
    assert "no dump files" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    write_run(tmp_path, [make_rollout(0, torch.Generator().manual_seed(0))])
    assert main(["analyze", str(tmp_path), "--config", "no_such_method"]) == 2
    assert "--config no_such_method: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", str(tmp_path), "--eps", "0"])
    assert exit_info.value.code == 2 and "must be a number > 0 and < 1.0 or 'auto'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "--help"])
    assert exit_info.value.code == 0 and "--max-response-len" in capsys.readouterr().out


def test_a_lab_style_rollout_data_dump_is_analysed(tmp_path, capsys, no_plots):
    """The CPU lab's rollout_data (CP = 1, one DP rank, hook metrics as per-sample lists) through the writer."""
    g = torch.Generator().manual_seed(9)
    for step in range(3):
        r = make_rollout(step, g, samples=4)
        data = {
            "rewards": r.rewards, "raw_reward": r.raw, "response_lengths": r.lengths,
            "total_lengths": [5 + n for n in r.lengths], "loss_masks": [m.int() for m in r.masks],
            "rollout_log_probs": r.rollout, "log_probs": r.train, "kl": [torch.zeros(n) for n in r.lengths],
            "truncated": r.truncated, "advantages": [torch.full((n,), a) for n, a in zip(r.lengths, r.rewards)],
            "mismatch_ctrl/discrepancy": [0.01] * 4,
        }
        write_train_dump(tmp_path, step, *samples_from_rollout_data(data))
    assert main(["analyze", str(tmp_path), "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["counts"] == {"rollouts": 3, "first": 0, "last": 2, "missing": {"count": 0, "ranges": [],
                                                                                 "more_ranges": 0},
                                "with_train_log_probs": 3, "with_rollout_log_probs": 3, "with_both_log_probs": 3,
                                "with_trained_tokens": 3, "measured": 3, "nonfinite_tokens": 0, "impossible_tokens": 0,
                                "nonfinite_rewards": 0}
    assert all(row["files"] == [str(tmp_path / "train_data" / f"{row['rollout_id']}.pt")]
               for row in result["rollouts"])


def lab_dump(directory, step, g, log_probs, rollout):
    """A train dump as the lab writes it, then its log-prob tensors replaced as a broken writer would store them."""
    r = make_rollout(step, g, samples=4)
    data = {"rewards": r.rewards, "raw_reward": r.raw, "response_lengths": r.lengths,
            "total_lengths": [5 + n for n in r.lengths], "loss_masks": [m.int() for m in r.masks],
            "rollout_log_probs": r.rollout, "log_probs": r.train,
            "kl": [torch.zeros(n) for n in r.lengths], "truncated": r.truncated}
    path = write_train_dump(directory, step, *samples_from_rollout_data(data))
    payload = torch.load(path, weights_only=True)
    for sample in payload["samples"]:
        sample["log_probs"], sample["rollout_log_probs"] = log_probs(sample["log_probs"]), rollout(
            sample["rollout_log_probs"])
    torch.save(payload, path)


@pytest.mark.parametrize("case, log_probs, rollout, message", [
    ("integer log-probs", lambda t: t.round().long(), lambda t: t, "log_probs holds integers (torch.int64)"),
    ("non-finite rollout log-probs", lambda t: t, lambda t: torch.full_like(t, float("nan")), "NaN/inf"),
])
def test_dumps_that_cannot_be_measured_exit_1_and_say_why(tmp_path, capsys, no_plots, case, log_probs, rollout,
                                                         message):
    g = torch.Generator().manual_seed(4)
    for step in range(2):
        lab_dump(tmp_path, step, g, log_probs, rollout)
    code = main(["analyze", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    report = tmp_path / "out" / "report.md"
    if code == 2:  # nothing readable at all: the refusal names each file and the reason
        assert "no readable rollout" in err and message in err and not report.exists()
    else:
        assert code == 1 and "no rollout could be measured" in err
        assert message in report.read_text()  # the reason, in the report's notes


@pytest.mark.parametrize("layout", ["out", "run"])
def test_a_lab_output_without_dumps_points_to_dump_details(tmp_path, capsys, layout):
    run = tmp_path / "grpo@e4m3" / "seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (tmp_path / "summary.json").write_text("{}")
    assert main(["analyze", str(tmp_path if layout == "out" else run)]) == 2
    err = capsys.readouterr().err
    assert "lab output without dumps" in err and "mismatch-ctrl lab --dump-details" in err


def test_rollouts_read_without_a_refused_train_dump_are_said_on_the_console(tmp_path, capsys, no_plots):
    """A train dump cut short next to its rollout dump (a job killed mid-write): the rollout is read from the rollout
    dump alone, without the training engine's log-probs; the console says so, not only the report."""
    g = torch.Generator().manual_seed(4)
    write_run(tmp_path, [make_rollout(i, g, samples=4, noise=0.03) for i in range(4)])
    for k in (1, 3):
        path = tmp_path / "train_data" / f"{k}.pt"
        path.write_bytes(path.read_bytes()[:100])
    assert main(["analyze", str(tmp_path), "--arch", "moe"]) == 0
    err = capsys.readouterr().err
    assert "2 rollout(s) with a refused dump file read from their other dump (rollouts 1, 3), 2 rollout(s) " \
           "measured" in err and "skipped" not in err.split("(the report")[0]


def test_an_eps_below_the_floor_is_explained_once_on_the_console_and_in_the_report(dumps, tmp_path, capsys,
                                                                                    no_plots):
    """The replayed DC-GRPO's infeasible-budget warning says why, what it means and what to do, once per run (not
    per rollout), on standard error with the command's prefix; the report's eps change says it too."""
    out = tmp_path / "analysis"
    assert main(["analyze", str(dumps), "--out", str(out), "--eps", "0.0001", "--arch", "moe"]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    at = [i for i, line in enumerate(lines) if "discrepancy floor" in line]
    assert len(at) == 1, err
    why, then = lines[at[0]], lines[at[0] + 1]
    assert why.startswith("mismatch-ctrl analyze: warning: DC-GRPO eps=0.0001 is below the rollout engine's "
                          "discrepancy floor")
    assert "acts as a constant penalty" in why and "eps: auto, or an eps above the floor" in then
    assert err.count("eps: auto, or an eps above the floor") == 1
    report = (out / "report.md").read_text()
    changes = [line for line in report.splitlines() if "infeasible-budget guard (`eps_guard: clamp`) raised" in line]
    assert len(changes) == 1 and "acts as a constant penalty" in changes[0] and "`eps: auto`" in changes[0]
    capsys.readouterr()
    assert main(["analyze", str(dumps), "--out", str(tmp_path / "a2"), "--eps", "0.5", "--arch", "moe"]) == 0
    assert "discrepancy floor" not in capsys.readouterr().err  # above the floor: nothing to explain
