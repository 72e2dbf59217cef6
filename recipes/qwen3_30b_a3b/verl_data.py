"""The recipe's data for verl: the JSONL of ``recipes.qwen3_30b_a3b.data`` as the parquet files verl's
``RLHFDataset`` reads (``data.train_files`` / ``data.val_files``; verl 0.9.1 ``utils/dataset/rl_dataset.py``: the
chat ``prompt``, ``data_source`` for the reward function, ``reward_model.ground_truth``).

    python -m recipes.qwen3_30b_a3b.verl_data --data-dir DIR      # reads DIR/*.jsonl, writes DIR/verl/*.parquet

Each record ``{"prompt": [...], "label": "34"}`` becomes ``{"data_source": <set>, "prompt": [...], "ability":
"math", "reward_model": {"style": "rule", "ground_truth": "34"}, "extra_info": {"index": i}}``. Written to
``<file>.tmp`` then renamed, like the JSONL.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from .data import EVAL_SETS, TRAIN_SET, output_path


def verl_record(record: dict[str, Any], data_source: str, index: int) -> dict[str, Any]:
    """One JSONL record of the recipe as a row of verl's RL dataset."""
    return {"data_source": data_source, "prompt": record["prompt"], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": record["label"]}, "extra_info": {"index": index}}


def parquet_path(data_dir: Path, name: str) -> Path:
    return data_dir / "verl" / f"{name}.parquet"


def _records(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def convert(data_dir: Path, name: str) -> Path:
    """``DIR/<set>.jsonl`` (or ``DIR/eval/<set>.jsonl``) -> ``DIR/verl/<set>.parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = output_path(data_dir, name)
    if not source.is_file():
        raise SystemExit(f"{source}: missing; run python -m recipes.qwen3_30b_a3b.data --out {data_dir} first")
    rows = [verl_record(r, name, i) for i, r in enumerate(_records(source))]
    target = parquet_path(data_dir, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, target)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.qwen3_30b_a3b.verl_data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, type=Path, help="the --out directory of recipes...data")
    args = parser.parse_args(argv)
    for name in (TRAIN_SET, *EVAL_SETS):
        print(convert(args.data_dir, name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
