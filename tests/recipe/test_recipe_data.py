"""Data preparation on small local datasets in the column layouts of the real hub datasets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recipes.qwen3_30b_a3b import data

DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
DAPO_PROBLEMS = [("What is $1+1$?", "2"), ("Find $x$ if $2x = 10$.", "5"), ("Compute $7 \\cdot 6$.", "42")]


def _dapo_row(problem, answer, index):
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": DAPO_TEMPLATE.format(problem), "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": str(index)},
    }


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def sources(tmp_path):
    """One local source per set, each in its hub dataset's layout; DAPO repeats problems like the real one does."""
    raw = tmp_path / "raw"
    raw.mkdir()
    dapo_rows = []
    for repeat in range(4):
        for number, (problem, answer) in enumerate(DAPO_PROBLEMS):
            dapo_rows.append(_dapo_row(problem, answer, 10 * repeat + number))
    dapo_rows.append(_dapo_row("  what is $1+1$?  ", "2", 99))  # same problem up to case and spacing
    dapo_rows.append(_dapo_row("A problem without an answer.", "", 100))
    dapo_rows.append({**_dapo_row("ignored", "3", 101), "prompt": []})
    pq.write_table(pa.Table.from_pylist(dapo_rows), raw / "dapo.parquet")

    _write_jsonl(
        raw / "aime24.jsonl",
        [
            {"id": 60, "problem": "AIME problem one.", "solution": "...", "answer": "204", "url": "u", "year": "2024"},
            {"id": 61, "problem": "AIME problem two.", "solution": "...", "answer": "025", "url": "u", "year": "2024"},
        ],
    )
    (raw / "aime25.json").write_text(
        json.dumps([{"problem": "Find the sum of bases.", "answer": "70", "id": "0"}]), encoding="utf-8"
    )
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"id": 0, "question": "AMC question A.", "answer": 27.0, "url": "u"},
                {"id": 1, "question": "AMC question B.", "answer": 0.5, "url": "u"},
            ]
        ),
        raw / "amc23.parquet",
    )
    import datasets

    datasets.DatasetDict(
        {
            "test": datasets.Dataset.from_list(
                [
                    {
                        "problem": "Simplify $\\frac{2}{4}$.",
                        "solution": "\\boxed{\\frac12}",
                        "answer": "\\frac{1}{2}",
                        "subject": "Algebra",
                        "level": 1,
                        "unique_id": "test/algebra/1.json",
                    },
                    {
                        "problem": "Simplify $\\frac{2}{4}$.",
                        "solution": "dup",
                        "answer": "\\frac{1}{2}",
                        "subject": "Algebra",
                        "level": 1,
                        "unique_id": "test/algebra/2.json",
                    },
                ]
            )
        }
    ).save_to_disk(str(raw / "math500_dir"))
    _write_jsonl(raw / "minerva.jsonl", [{"question": "Minerva question.", "answer": "4.5 \\times 10^{3}"}])
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "id": 1,
                    "question": "Olympiad one.",
                    "final_answer": ["$\\frac{1}{2}$"],
                    "is_multiple_answer": False,
                    "unit": None,
                    "answer_type": "Numerical",
                },
                {
                    "id": 2,
                    "question": "Olympiad two.",
                    "final_answer": ["$3$", "$5$"],
                    "is_multiple_answer": True,
                    "unit": None,
                    "answer_type": "Numerical",
                },
                {
                    "id": 3,
                    "question": "Olympiad three.",
                    "final_answer": [],
                    "is_multiple_answer": False,
                    "unit": None,
                    "answer_type": "Numerical",
                },
            ]
        ),
        raw / "olympiadbench.parquet",
    )
    return {
        "dapo-math-17k": raw / "dapo.parquet",
        "aime24": raw / "aime24.jsonl",
        "aime25": raw / "aime25.json",
        "amc23": raw / "amc23.parquet",
        "math500": raw / "math500_dir",
        "minerva": raw / "minerva.jsonl",
        "olympiadbench": raw / "olympiadbench.parquet",
    }


def _source_args(sources):
    return [arg for name, path in sources.items() for arg in ("--source", f"{name}={path}")]


def _read(path: Path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _pairs(path: Path):
    """(problem, label) per record, checking the slime record shape on the way."""
    pairs = []
    for record in _read(path):
        assert set(record) == {"prompt", "label"}
        assert isinstance(record["label"], str)
        [message] = record["prompt"]
        assert message["role"] == "user"
        problem, instruction = message["content"].rsplit("\n\n", 1)
        assert instruction == data.INSTRUCTION
        pairs.append((problem, record["label"]))
    return pairs


EXPECTED = {
    "dapo-math-17k": DAPO_PROBLEMS,
    "aime24": [("AIME problem one.", "204"), ("AIME problem two.", "025")],
    "aime25": [("Find the sum of bases.", "70")],
    "amc23": [("AMC question A.", "27"), ("AMC question B.", "0.5")],
    "math500": [("Simplify $\\frac{2}{4}$.", "\\frac{1}{2}")],
    "minerva": [("Minerva question.", "4.5 \\times 10^{3}")],
    "olympiadbench": [("Olympiad one.", "\\frac{1}{2}"), ("Olympiad two.", "3, 5")],
}


def test_prepares_every_set_in_slime_format(tmp_path, sources, capsys):
    out = tmp_path / "out"
    assert data.main(["--out", str(out), "--no-progress", *_source_args(sources)]) == 0
    assert _pairs(out / "dapo-math-17k.jsonl") == EXPECTED["dapo-math-17k"]
    for name in data.EVAL_SETS:
        assert _pairs(out / "eval" / f"{name}.jsonl") == EXPECTED[name], name

    table = {line.split()[0]: line.split()[1:5] for line in capsys.readouterr().out.splitlines()[1:]}
    # DAPO: 12 repeated rows + 1 case/space variant + 2 invalid = 15 read; 3 kept; 10 duplicates; 2 invalid.
    assert table["dapo-math-17k"] == ["15", "3", "10", "2"]
    assert table["math500"] == ["2", "1", "1", "0"]
    assert table["olympiadbench"] == ["3", "2", "0", "1"]


def test_only_limits_the_sets(tmp_path, sources):
    train_out, eval_out = tmp_path / "train", tmp_path / "eval_only"
    assert data.main(["--out", str(train_out), "--only", "train", "--no-progress", *_source_args(sources)]) == 0
    assert (train_out / "dapo-math-17k.jsonl").exists() and not (train_out / "eval").exists()
    assert data.main(["--out", str(eval_out), "--only", "eval", "--no-progress", *_source_args(sources)]) == 0
    assert not (eval_out / "dapo-math-17k.jsonl").exists()
    assert sorted(p.name for p in (eval_out / "eval").iterdir()) == sorted(f"{n}.jsonl" for n in data.EVAL_SETS)


def test_existing_outputs_are_skipped_unless_forced(tmp_path, sources, capsys):
    out = tmp_path / "out"
    args = ["--out", str(out), "--only", "eval", "--no-progress"]
    assert data.main([*args, *_source_args(sources)]) == 0
    target = out / "eval" / "aime24.jsonl"
    before = target.read_bytes()

    # Second run: sources are not even read (a missing file would fail), outputs untouched.
    missing = [arg for name in data.EVAL_SETS for arg in ("--source", f"{name}={tmp_path}/missing.jsonl")]
    capsys.readouterr()
    assert data.main([*args, *missing]) == 0
    assert "exists, skipped" in capsys.readouterr().out
    assert target.read_bytes() == before

    _write_jsonl(sources["aime24"], [{"problem": "A new problem.", "answer": "1"}])
    assert data.main([*args, "--force", *_source_args(sources)]) == 0
    assert _pairs(target) == [("A new problem.", "1")]


def test_interrupted_write_leaves_no_output_and_rerun_completes(tmp_path, sources, monkeypatch):
    out = tmp_path / "out"
    target = data.output_path(out, "dapo-math-17k")
    target.parent.mkdir(parents=True)
    target.with_name(target.name + ".tmp").write_text("junk from an earlier crash\n")
    real_record = data.slime_record
    calls = []

    def crash_on_second(problem, label):
        calls.append(problem)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_record(problem, label)

    monkeypatch.setattr(data, "slime_record", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        data.prepare_set("dapo-math-17k", out, str(sources["dapo-math-17k"]), progress=False)
    assert not target.exists()
    assert not target.with_name(target.name + ".tmp").exists()

    monkeypatch.setattr(data, "slime_record", real_record)
    summary = data.prepare_set("dapo-math-17k", out, str(sources["dapo-math-17k"]), progress=False)
    assert summary.kept == 3 and _pairs(target) == EXPECTED["dapo-math-17k"]


def test_layout_mismatch_names_source_and_missing_column(tmp_path, capsys):
    odd = _write_jsonl(tmp_path / "odd.jsonl", [{"q": "What is 2+2?", "a": "4"}])
    out = tmp_path / "out"
    assert data.main(["--out", str(out), "--only", "eval", "--no-progress", "--source", f"aime24={odd}"]) == 1
    message = capsys.readouterr().err
    assert "aime24" in message and str(odd) in message
    assert "'problem'" in message and "missing" in message and "--columns" in message
    assert not (out / "eval" / "aime24.jsonl").exists()

    assert data.prepare_set("aime24", out, str(odd), data.Layout("q", "a"), progress=False).kept == 1
    assert _pairs(out / "eval" / "aime24.jsonl") == [("What is 2+2?", "4")]


def test_malformed_jsonl_is_a_clear_error(tmp_path, capsys):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"problem": "P.", "answer": "1"}\n{"problem": "Q.", "answ\n', encoding="utf-8")
    out = tmp_path / "out"
    assert data.main(["--out", str(out), "--only", "eval", "--no-progress", "--source", f"aime24={broken}"]) == 1
    message = capsys.readouterr().err
    assert "aime24" in message and "line 2" in message
    assert not (out / "eval" / "aime24.jsonl").exists()


def test_missing_local_file_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "aime24.parquet"
    assert data.main(["--out", str(tmp_path), "--only", "eval", "--source", f"aime24={missing}"]) == 1
    assert "aime24" in capsys.readouterr().err


def test_default_sources_are_the_documented_hub_ids(tmp_path, monkeypatch):
    import datasets

    requested = []

    def fake_load_dataset(repo, config=None, split=None):
        requested.append((repo, config, split))
        return datasets.Dataset.from_list([{"problem": "P.", "answer": "1", "question": "P.", "final_answer": ["1"]}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data.prepare(tmp_path, only="eval", sources={"minerva": "someone/minerva-copy:validation"}, progress=False)
    assert requested == [
        ("HuggingFaceH4/aime_2024", None, "train"),
        ("math-ai/aime25", None, "test"),
        ("math-ai/amc23", None, "test"),
        ("HuggingFaceH4/MATH-500", None, "test"),
        ("someone/minerva-copy", None, "validation"),
        ("math-ai/olympiadbench", None, "test"),
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (27.0, "27"),
        (0.25, "0.25"),
        (7, "7"),
        ("$\\frac{1}{3}$", "\\frac{1}{3}"),
        (["$3$", "$5$"], "3, 5"),
        ("So it is \\boxed{12}.", "12"),
        ("  ", None),
        ([], None),
        (None, None),
        (float("nan"), None),
    ],
)
def test_label_text(value, expected):
    assert data.label_text(value) == expected


def test_problem_text_strips_wrappers_from_messages():
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": DAPO_TEMPLATE.format("Q?")}]
    assert data.problem_text(messages) == "Q?"
    assert data.problem_text(f"Q?\n\n{data.INSTRUCTION}") == "Q?"
    assert data.problem_text([{"role": "assistant", "content": "A"}]) is None


def test_cli_help_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "recipes.qwen3_30b_a3b.data", "--help"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert result.returncode == 0
    assert "--source" in result.stdout and "--only" in result.stdout
