"""Where the recipe's data sets come from: their default hub locations and column layouts, and the rows of a local
file, a ``save_to_disk`` directory or a hub dataset (``load_rows``), read in batches (``iter_rows``).

The default sources and layouts are listed, with their dataset cards' columns, in ``data.py``'s docstring.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

TRAIN_SET = "dapo-math-17k"
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
_HUB_ID = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<config>[\w.-]+))?(?::(?P<split>[\w.-]+))?$")


@dataclass(frozen=True)
class Layout:
    """Where a row keeps its problem and its answer (dotted paths into structs allowed)."""

    problem: str
    answer: str


@dataclass(frozen=True)
class Source:
    """Default hub location of a set and the column layouts it may come in."""

    hub_id: str
    split: str
    layouts: tuple[Layout, ...]


_SLIME_LAYOUT = Layout("prompt", "label")

SOURCES: dict[str, Source] = {
    TRAIN_SET: Source(
        "BytedTsinghua-SIA/DAPO-Math-17k",
        "train",
        (Layout("prompt", "reward_model.ground_truth"), Layout("prompt", "solution"), _SLIME_LAYOUT),
    ),
    "aime24": Source(
        "HuggingFaceH4/aime_2024", "train", (Layout("problem", "answer"), Layout("Problem", "Answer"), _SLIME_LAYOUT)
    ),
    "aime25": Source(
        "math-ai/aime25", "test", (Layout("problem", "answer"), Layout("question", "answer"), _SLIME_LAYOUT)
    ),
    "amc23": Source(
        "math-ai/amc23", "test", (Layout("question", "answer"), Layout("problem", "answer"), _SLIME_LAYOUT)
    ),
    "math500": Source("HuggingFaceH4/MATH-500", "test", (Layout("problem", "answer"), _SLIME_LAYOUT)),
    "minerva": Source(
        "math-ai/minervamath",
        "test",
        (Layout("question", "answer"), Layout("problem", "answer"), Layout("problem", "solution"), _SLIME_LAYOUT),
    ),
    "olympiadbench": Source(
        "math-ai/olympiadbench",
        "test",
        (Layout("question", "final_answer"), Layout("question", "answer"), Layout("problem", "answer"), _SLIME_LAYOUT),
    ),
}


class DataPrepError(RuntimeError):
    """A source cannot be read or does not have a known layout; the message names the set and what to do."""


class SizedRows(Protocol):
    """Rows that can be counted and iterated: a list, a ``datasets.Dataset`` or a ``LocalRows``."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[dict[str, Any]]: ...


class LocalRows:
    """Rows of a local .jsonl/.json/.parquet file. JSONL and parquet are streamed (DAPO-Math-17k has ~1.8M rows)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._array: list[dict[str, Any]] | None = None
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            self._count = pq.ParquetFile(path).metadata.num_rows
            return
        if path.suffix == ".json":
            text = path.read_text(encoding="utf-8")
            if text.lstrip().startswith("["):
                self._array = json.loads(text)
                self._count = len(self._array)
                return
        with path.open("rb") as handle:
            self._count = sum(1 for line in handle if line.strip())

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.path.suffix == ".parquet":
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(self.path).iter_batches(batch_size=1024):
                yield from batch.to_pylist()
            return
        if self._array is not None:
            rows: Iterable[tuple[int, Any]] = enumerate(self._array, start=1)
        else:
            rows = self._jsonl_objects()
        for number, row in rows:
            if not isinstance(row, dict):
                raise ValueError(f"{self.path}: row {number} is not a JSON object")  # noqa: TRY004 - bad file content
            yield row

    def _jsonl_objects(self) -> Iterator[tuple[int, Any]]:
        with self.path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        yield number, json.loads(line)
                    except json.JSONDecodeError as error:
                        raise ValueError(f"{self.path}: line {number} is not valid JSON ({error})") from error


def _pick_split(loaded: Any, split: str, where: str) -> Any:
    if not hasattr(loaded, "keys"):
        return loaded
    if split in loaded:
        return loaded[split]
    if len(loaded) == 1:
        return next(iter(loaded.values()))
    raise DataPrepError(f"{where}: no split {split!r}; splits present: {sorted(loaded)}. Append :SPLIT to the hub id.")


def load_rows(name: str, location: str | None) -> tuple[SizedRows, str]:
    """Rows of set ``name`` from ``location`` (local file, ``save_to_disk`` directory or hub id; None = default hub id).

    Returns the rows and a description of where they came from.
    """
    source = SOURCES[name]
    location = location or source.hub_id
    path = Path(location).expanduser()
    if path.is_file():
        if path.suffix not in LOCAL_SUFFIXES:
            raise DataPrepError(f"{name}: {path} is not one of {', '.join(LOCAL_SUFFIXES)}")
        try:
            return LocalRows(path), str(path)
        except (OSError, ValueError) as error:
            raise DataPrepError(f"{name}: cannot read {path}: {error}") from error
    if path.is_dir():
        import datasets

        try:
            loaded = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError) as error:
            raise DataPrepError(
                f"{name}: {path} is a directory but not one written by datasets' save_to_disk: {error}"
            ) from error
        dataset = _pick_split(loaded, source.split, f"{name} ({path})")
        return dataset, str(path)
    if location.endswith(LOCAL_SUFFIXES) or location.startswith((".", "/", "~")):
        raise DataPrepError(f"{name}: local file {location} not found")
    hub = _HUB_ID.match(location)
    if hub is None:
        raise DataPrepError(
            f"{name}: {location!r} is neither an existing path nor a hub id OWNER/NAME[@CONFIG][:SPLIT]"
        )
    repo = hub["repo"]
    config = hub["config"]
    split = hub["split"] or source.split
    where = f"hub {repo}" + (f"@{config}" if config else "") + f":{split}"
    import datasets

    try:
        dataset = datasets.load_dataset(repo, config, split=split)
    except Exception as error:
        raise DataPrepError(
            f"{name} ({where}): cannot load: {error}. Offline? Pass --source {name}=PATH to a local "
            ".jsonl/.json/.parquet file or a save_to_disk directory."
        ) from error
    return dataset, where


def iter_rows(rows: SizedRows) -> Iterator[dict[str, Any]]:
    """Rows as dicts; a ``datasets.Dataset`` is read in batches, which is several times faster than row by row."""
    if not hasattr(rows, "iter"):
        yield from rows
        return
    for batch in rows.iter(batch_size=1024):
        columns = list(batch)
        for values in zip(*(batch[column] for column in columns)):
            yield dict(zip(columns, values))
