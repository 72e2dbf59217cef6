"""Prepare the recipe's math data as slime JSONL: DAPO-Math-17k for training, six benchmarks for evaluation.

Output (``--out DIR``), one JSON object per line, used with ``--input-key prompt --label-key label
--apply-chat-template``::

    DIR/dapo-math-17k.jsonl
    DIR/eval/{aime24,aime25,amc23,math500,minerva,olympiadbench}.jsonl

    {"prompt": [{"role": "user", "content": "<problem>\\n\\n<INSTRUCTION>"}], "label": "34"}

Default sources (hub id, split; problem column, answer column), checked against the dataset cards:

=============  ===================================  =====  ======================  ================================
set            hub id                               split  problem column          answer column
=============  ===================================  =====  ======================  ================================
dapo-math-17k  BytedTsinghua-SIA/DAPO-Math-17k      train  prompt (chat messages)  reward_model.ground_truth
aime24         HuggingFaceH4/aime_2024              train  problem                 answer
aime25         math-ai/aime25                       test   problem                 answer
amc23          math-ai/amc23                        test   question                answer (a number, e.g. 27.0)
math500        HuggingFaceH4/MATH-500               test   problem                 answer
minerva        math-ai/minervamath                  test   question                answer
olympiadbench  math-ai/olympiadbench                test   question                final_answer (a string list)
=============  ===================================  =====  ======================  ================================

Each set also accepts a few other known layouts (``SOURCES[name].layouts``, tried in order), among them slime's
own ``prompt``/``label``; ``--columns NAME=PROBLEM,ANSWER`` forces one. A column may be a dotted path into a struct.

Problems: chat messages give the last user message; DAPO's own "Solve the following math problem step by step
... Answer: $Answer ..." wrapper (and this module's instruction) is removed, so every set gets the same
``INSTRUCTION``. Labels are strings: integral floats lose ``.0``, lists are joined with ", ", surrounding ``$``
are dropped, and a label holding a full solution is reduced to its last ``\\boxed{}``. Rows with an empty problem
or label are dropped (counted as dropped-invalid); duplicates by normalised problem text (NFKC, case-folded,
whitespace collapsed) keep their first occurrence (DAPO-Math-17k repeats each of its ~17k problems ~100 times).

A set whose output exists is skipped unless ``--force``; outputs are written to ``<file>.tmp`` then renamed, so an
interrupted run never leaves a file a re-run would trust.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .boxed import last_boxed_content
from .sources import SOURCES, TRAIN_SET, DataPrepError, Layout, iter_rows, load_rows

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
EVAL_SETS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")

_DAPO_PREFIX = re.compile(
    r"^\s*Solve the following math problem step by step\. The last line of your response should be of the form "
    r"Answer: .*? where \$Answer is the answer to the problem\.\s*"
)
_DAPO_SUFFIX = re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$")


@dataclass
class SetSummary:
    """Counts for one set; ``skipped`` when its output already existed."""

    name: str
    output: Path
    read: int = 0
    kept: int = 0
    duplicates: int = 0
    dropped_invalid: int = 0
    skipped: bool = False


def output_path(out_dir: Path, name: str) -> Path:
    """``DIR/dapo-math-17k.jsonl`` for the training set, ``DIR/eval/<name>.jsonl`` for a benchmark."""
    if name == TRAIN_SET:
        return out_dir / f"{name}.jsonl"
    return out_dir / "eval" / f"{name}.jsonl"


def normalize_problem_key(problem: str) -> str:
    """Deduplication key: NFKC, case-folded, whitespace runs collapsed to one space."""
    return " ".join(unicodedata.normalize("NFKC", problem).casefold().split())


def problem_text(value: Any) -> str | None:
    """The bare problem from a string or chat messages, without DAPO's wrapper or this module's instruction."""
    if isinstance(value, (list, tuple)):
        user_contents = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = user_contents[-1] if user_contents else None
    if not isinstance(value, str):
        return None
    text = _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", value)).strip()
    if text.endswith(INSTRUCTION):
        text = text[: -len(INSTRUCTION)].strip()
    return text or None


def label_text(value: Any) -> str | None:
    """The label as a non-empty string (see the module doc), or None when there is none."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (list, tuple)):
        parts = [part for part in (label_text(item) for item in value) if part]
        return ", ".join(parts) if parts else None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if "\\boxed" in text:
        text = (last_boxed_content(text) or "").strip()
    if len(text) >= 2 and text[0] == text[-1] == "$":
        text = text.strip("$").strip()
    return text or None


def slime_record(problem: str, label: str) -> dict[str, Any]:
    """One slime JSONL object: the problem plus ``INSTRUCTION`` as a single user message, and the label."""
    return {"prompt": [{"role": "user", "content": f"{problem}\n\n{INSTRUCTION}"}], "label": label}


def _field(row: dict[str, Any], path: str) -> Any:
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise KeyError(path)
        value = value[key]
    return value


def _has_field(row: dict[str, Any], path: str) -> bool:
    try:
        _field(row, path)
    except KeyError:
        return False
    return True


def choose_layout(name: str, where: str, first_row: dict[str, Any], layouts: Sequence[Layout]) -> Layout:
    """The first layout whose problem and answer columns exist in ``first_row``; else a DataPrepError naming them."""
    for layout in layouts:
        if _has_field(first_row, layout.problem) and _has_field(first_row, layout.answer):
            return layout
    expected = "; ".join(
        f"problem {layout.problem!r} + answer {layout.answer!r} (missing: "
        + ", ".join(repr(c) for c in (layout.problem, layout.answer) if not _has_field(first_row, c))
        + ")"
        for layout in layouts
    )
    raise DataPrepError(
        f"{name} ({where}): no known column layout matches. Columns present: {sorted(first_row)}. "
        f"Expected one of: {expected}. Pass --columns {name}=PROBLEM_COLUMN,ANSWER_COLUMN to name them."
    )


def convert_rows(rows: Iterable[dict[str, Any]], layout: Layout, summary: SetSummary) -> Iterator[dict[str, Any]]:
    """Slime records from raw rows, counting into ``summary``: invalid rows dropped, duplicates removed."""
    seen: set[str] = set()
    for row in rows:
        summary.read += 1
        try:
            problem = problem_text(_field(row, layout.problem))
            label = label_text(_field(row, layout.answer))
        except KeyError:
            problem = label = None
        if problem is None or label is None:
            summary.dropped_invalid += 1
            continue
        key = normalize_problem_key(problem)
        if key in seen:
            summary.duplicates += 1
            continue
        seen.add(key)
        summary.kept += 1
        yield slime_record(problem, label)


def write_jsonl_atomically(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Write ``records`` to ``path.tmp``, fsync, then rename onto ``path``; the tmp file is removed on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def prepare_set(
    name: str,
    out_dir: Path,
    location: str | None = None,
    layout: Layout | None = None,
    force: bool = False,
    progress: bool = True,
) -> SetSummary:
    """Write one set's slime JSONL under ``out_dir`` (skipped when it exists and not ``force``)."""
    from tqdm import tqdm

    summary = SetSummary(name=name, output=output_path(out_dir, name))
    if summary.output.exists() and not force:
        summary.skipped = True
        return summary
    rows, where = load_rows(name, location)
    try:
        first_row = next(iter(rows), None)
        if first_row is None:
            raise DataPrepError(f"{name} ({where}): the source has no rows")
        chosen = choose_layout(name, where, first_row, (layout,) if layout else SOURCES[name].layouts)
        if hasattr(rows, "select_columns"):
            rows = rows.select_columns(sorted({chosen.problem.split(".")[0], chosen.answer.split(".")[0]}))
        bar = tqdm(iter_rows(rows), total=len(rows), desc=name, unit="row", disable=not progress, file=sys.stderr)
        write_jsonl_atomically(summary.output, convert_rows(bar, chosen, summary))
    except (OSError, ValueError) as error:
        raise DataPrepError(f"{name} ({where}): {error}") from error
    return summary


def prepare(
    out_dir: Path,
    only: str | None = None,
    sources: dict[str, str] | None = None,
    columns: dict[str, Layout] | None = None,
    force: bool = False,
    progress: bool = True,
) -> list[SetSummary]:
    """Prepare the training set (``only="train"``), the six benchmarks (``only="eval"``) or all of them."""
    names = {"train": [TRAIN_SET], "eval": list(EVAL_SETS), None: [TRAIN_SET, *EVAL_SETS]}[only]
    sources = sources or {}
    columns = columns or {}
    return [
        prepare_set(name, Path(out_dir), sources.get(name), columns.get(name), force=force, progress=progress)
        for name in names
    ]


def format_summary(summaries: Sequence[SetSummary]) -> str:
    """A fixed-width table: set, read, kept, duplicates, dropped-invalid, output (or 'exists, skipped')."""
    header = ("set", "read", "kept", "duplicates", "dropped-invalid", "output")
    lines = [f"{header[0]:<14}{header[1]:>10}{header[2]:>8}{header[3]:>12}{header[4]:>17}  {header[5]}"]
    for s in summaries:
        if s.skipped:
            lines.append(f"{s.name:<14}{'-':>10}{'-':>8}{'-':>12}{'-':>17}  {s.output} (exists, skipped)")
        else:
            lines.append(f"{s.name:<14}{s.read:>10}{s.kept:>8}{s.duplicates:>12}{s.dropped_invalid:>17}  {s.output}")
    return "\n".join(lines)


def _name_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    valid = (TRAIN_SET, *EVAL_SETS)
    if not sep or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    if name not in valid:
        raise argparse.ArgumentTypeError(f"unknown set {name!r}; sets are {', '.join(valid)}")
    return name, value


def _columns_arg(text: str) -> tuple[str, Layout]:
    name, value = _name_value(text)
    problem, sep, answer = value.partition(",")
    if not sep or not problem.strip() or not answer.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=PROBLEM_COLUMN,ANSWER_COLUMN, got {text!r}")
    return name, Layout(problem.strip(), answer.strip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.qwen3_30b_a3b.data",
        description=(
            "Write the recipe's slime JSONL: OUT/dapo-math-17k.jsonl (training) and OUT/eval/{"
            + ",".join(EVAL_SETS)
            + "}.jsonl. Sets whose output exists are skipped unless --force."
        ),
        epilog="Default sources: "
        + "; ".join(f"{name}={source.hub_id}:{source.split}" for name, source in SOURCES.items()),
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument(
        "--only", choices=("train", "eval"), help="prepare only the training set or only the benchmarks"
    )
    parser.add_argument(
        "--source",
        action="append",
        type=_name_value,
        default=[],
        metavar="NAME=PATH_OR_HUB_ID",
        help="read set NAME from a local .jsonl/.json/.parquet file, a datasets save_to_disk directory, or a hub id "
        "OWNER/NAME[@CONFIG][:SPLIT] (repeatable)",
    )
    parser.add_argument(
        "--columns",
        action="append",
        type=_columns_arg,
        default=[],
        metavar="NAME=PROBLEM,ANSWER",
        help="column names (dotted paths allowed) of set NAME's problem and answer, overriding the known layouts",
    )
    parser.add_argument("--force", action="store_true", help="rewrite outputs that already exist")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns 0 on success, 1 on a data error (message on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        summaries = prepare(
            args.out,
            only=args.only,
            sources=dict(args.source),
            columns=dict(args.columns),
            force=args.force,
            progress=not args.no_progress,
        )
    except DataPrepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(format_summary(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
