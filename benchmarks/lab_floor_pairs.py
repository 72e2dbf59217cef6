"""Paired comparisons of discrepancy floors from ``benchmarks/lab_mismatch.py --json`` files: per seed, the ratio of
two engines' floors (median ``C_bar`` over the rollouts of the same warmed-up policy), mean with its 95% t interval
over the seeds, for every pair ``A/B`` asked for; also each engine's floor over the seeds.

    python benchmarks/lab_floor_pairs.py runs/floor/*.json --pairs fp16+train-fp16/bf16+train-bf16 ...

A file holds one run of ``lab_mismatch.py`` (any seeds); a seed found in two files is refused (it would count twice).
``--seeds`` keeps a subset (e.g. the unseen seeds of a claim).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mismatch_ctrl import regular_files
from mismatch_ctrl.lab.results.stats import spread
from mismatch_ctrl.lab.sweeps.options import seed_list


def floors(paths: list[Path], policy: str) -> dict[str, dict[int, float]]:
    """Engine -> seed -> floor of ``policy`` over the files (``results[<policy>@<engine>]['seeds']``, in the order of
    the file's ``args.seeds``); ValueError for a seed measured twice or a file that is not such JSON, OSError for one
    that cannot be read (no regular file)."""
    out: dict[str, dict[int, float]] = {}
    for path in paths:
        try:
            data = regular_files.read_json(path)  # a FIFO or a folder refused by name, never waited on
        except ValueError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
        try:
            seeds = data["args"]["seeds"]
            entries = [(name, entry["seeds"]) for name, entry in data["results"].items()]
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f"{path}: not a file written by lab_mismatch.py --json (no args.seeds and results)"
                             ) from None
        for name, runs in entries:
            kind, _, engine = name.partition("@")
            if kind != policy:
                continue
            by_seed = out.setdefault(engine, {})
            for seed, floor in zip(seeds, runs):
                if seed in by_seed:
                    raise ValueError(f"{path}: {name} seed {seed} is in another file too; give each seed once")
                by_seed[seed] = floor["floor"]
    return out


def cell(values: list[float], digits: str = ".3g") -> str:
    s = spread(values)
    return f"{s.mean:{digits}} [{s.low:{digits}}, {s.high:{digits}}]" if s.low is not None else f"{s.mean:{digits}}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="--json outputs of benchmarks/lab_mismatch.py")
    parser.add_argument("--pairs", nargs="+", default=[], metavar="A/B", help="engine pairs: floor(A) / floor(B)")
    parser.add_argument("--policy", default="moe", help="policy kind (default: moe)")
    parser.add_argument("--seeds", type=seed_list, help="only these seeds (default: every seed of the files)")
    args = parser.parse_args(argv)
    try:
        table = floors(args.files, args.policy)
    except FileNotFoundError as exc:
        parser.error(f"no such file: {exc.filename} (give the --json outputs of benchmarks/lab_mismatch.py)")
    except (OSError, ValueError) as exc:  # a FIFO, a folder, not UTF-8 or JSON, a seed twice
        parser.error(f"{exc} (give the --json outputs of benchmarks/lab_mismatch.py)")
    if args.seeds is not None:
        table = {engine: {s: v for s, v in by_seed.items() if s in args.seeds} for engine, by_seed in table.items()}
    print(f"policy {args.policy}; mean [95% t interval] over seeds; floor = median C_bar over a seed's rollouts\n")
    print("| engine | seeds | floor |\n|---|---|---|")
    for engine, by_seed in sorted(table.items(), key=lambda item: sum(item[1].values()) / max(len(item[1]), 1)):
        if by_seed:
            print(f"| `{engine}` | {len(by_seed)} | {cell(list(by_seed.values()))} |")
    if args.pairs:
        print("\n| floor A / floor B, paired by seed | seeds | ratio |\n|---|---|---|")
    for pair in args.pairs:
        a, _, b = pair.partition("/")
        if a not in table or b not in table:
            parser.error(f"--pairs {pair}: engines measured: {', '.join(sorted(table))}")
        common = sorted(set(table[a]) & set(table[b]))
        if not common:
            parser.error(f"--pairs {pair}: no seed has both")
        ratios = [table[a][s] / table[b][s] for s in common]
        print(f"| `{a}` / `{b}` | {len(common)} | {cell(ratios, '.3f')} |")


if __name__ == "__main__":
    main()
