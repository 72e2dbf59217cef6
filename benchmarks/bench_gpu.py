"""What one call of each slime hook costs on a CUDA GPU: host synchronisations and time, against one pass.

- **host syncs**: synchronisations the CUDA runtime reports during one call (``torch.cuda.set_sync_debug_mode``),
  for two batch sizes of each case: the count must not grow with the number of sequences. A case over budget also
  prints where each synchronisation happened.
- **time**: median wall time of one call, the device synchronised before and after (what the call holds up the
  training step), over ``--repeats`` calls after warm-up calls; next to one **pass** over the same log-probs,
  ``(exp(a) - exp(b)).abs().sum()``, the least any hook must read.

Cases (slime-shaped inputs on the GPU, as the hooks receive them; lengths uniform in the range):

- TIS hook, Geo-MIS (``configs/methods/geo_mis.yaml``), 8 responses of 1k-4k tokens (~22k) and 64 of 100-600;
- TIS hook, slime's ``examples/train_infer_mismatch_helper/mis.yaml`` settings, 64 responses of 1k-8k (~290k);
- TIS hook, Geo-MIS with ``torch_compile: true`` (``mismatch_ctrl.compiled``: the device work as one graph of fused
  kernels), the two Geo-MIS batches; its first call, which compiles, is timed on its own (``first s``);
- advantage hook, DC-GRPO with every mismatch metric and the surge detector, 512 responses of 1k-8k (~2.3M), a
  whole rollout of one data-parallel rank.

Targets (docs/performance.md): the TIS hook at most 1 sync and 0.5 ms at 22k tokens, the advantage hook at most 2
syncs and 1.5 ms at 2.3M tokens, both constant in the number of sequences. Without CUDA it says so and exits 0 (``make
bench`` runs it everywhere).

    python benchmarks/bench_gpu.py                       # every case
    python benchmarks/bench_gpu.py --json report.json    # also write the numbers as JSON
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the source tree, where mismatch_ctrl is not installed (the device machine's python3)
    sys.path.insert(0, str(ROOT))

from bench_hooks import advantage_call, local_view, make_args, make_rollout, tis_call  # noqa: E402 (benchmarks/)
from mismatch_ctrl import host  # noqa: E402
from bench_options import REPEATS, SEED, check_output_file  # noqa: E402 (benchmarks/)

SLIME_MIS = dict(use_tis=True, use_rs=True, tis_level="token", rs_level="token", tis_mode="truncate",
                 tis_lower_bound=0.5, tis_upper_bound=2.0, rs_lower_bound=None, rs_upper_bound=None,
                 rs_veto_threshold=1.0e-4, tis_batch_normalize=True)
"""slime 624b824a ``examples/train_infer_mismatch_helper/mis.yaml`` (our reading of its keys, tests/unit)."""
SECTIONS = {
    "Geo-MIS": {"name": "geo_mis", "correction": {"preset": "geo_mis"}},
    "slime mis.yaml": {"name": "slime_mis", "correction": SLIME_MIS},
    "DC-GRPO": {"name": "dcgrpo", "dcgrpo": {"enabled": True}},
    "Geo-MIS compiled": {"name": "geo_mis", "correction": {"preset": "geo_mis"}, "torch_compile": True},
}
CASES = [
    # hook, settings, (responses, min length, max length) for the timed batch, responses of the second sync count
    ("tis", "Geo-MIS", (8, 1000, 4000), 64),
    ("tis", "Geo-MIS", (64, 100, 600), 8),
    ("tis", "slime mis.yaml", (64, 1000, 8000), 8),
    ("tis", "Geo-MIS compiled", (8, 1000, 4000), 64),
    ("tis", "Geo-MIS compiled", (64, 100, 600), 8),
    ("advantages", "DC-GRPO", (512, 1000, 8000), 64),
]
TARGETS = {"tis": {"syncs": 1, "ms": 0.5, "tokens": 22_000}, "advantages": {"syncs": 2, "ms": 1.5, "tokens": 2_300_000}}
"""The hooks' targets; the time target applies at (about) its token count."""


def on_gpu(view: dict[str, Any]) -> dict[str, Any]:
    return {key: [t.cuda() for t in value] if value and isinstance(value[0], torch.Tensor) else value
            for key, value in view.items()}


def hook(kind: str, settings: str, seqs: int, min_len: int, max_len: int,
         seed: int) -> tuple[Callable, int, Callable, float]:
    """The call of one case (runtime created, warmed up), its token count, one pass over its log-probs, and the
    seconds of its first call (which creates the runtime and, compiled, compiles the graph)."""
    view = on_gpu(local_view(make_rollout(seqs, min_len, max_len, seed), list(range(seqs))))
    args = make_args(SECTIONS[settings])
    call = (advantage_call if kind == "advantages" else tis_call)(args, view)
    a, b = torch.cat(view["log_probs"]), torch.cat(view["rollout_log_probs"])
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    for _ in range(2):
        call()
    return call, a.numel(), lambda: (torch.exp(a) - torch.exp(b)).abs().sum(), first


def sync_sites(call: Callable[[], object]) -> list[str]:
    """Where the CUDA runtime reports a host synchronisation during one call (:func:`mismatch_ctrl.host.cuda_syncs`):
    one entry per synchronisation."""
    with host.cuda_syncs() as sites:
        call()
    return sites


def median_ms(call: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``call``, the device synchronised before and after each."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return 1e3 * statistics.median(samples)


def measure(repeats: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for kind, settings, (seqs, min_len, max_len), other in CASES:
        call, tokens, one_pass, first = hook(kind, settings, seqs, min_len, max_len, seed)
        other_call, _, _, _ = hook(kind, settings, other, min_len, max_len, seed + 1)
        sites, sites_other = sync_sites(call), sync_sites(other_call)
        row = {"hook": kind, "settings": settings, "responses": seqs, "lengths": [min_len, max_len], "tokens": tokens,
               "syncs": len(sites), "syncs_other": len(sites_other), "responses_other": other,
               "sync_sites": sites, "sync_sites_other": sites_other,
               "ms": median_ms(call, repeats), "pass_ms": median_ms(one_pass, repeats), "first_s": first}
        target = TARGETS[kind]
        row["syncs_ok"] = row["syncs"] <= target["syncs"] and row["syncs"] == row["syncs_other"]
        row["ms_target"] = target["ms"] if abs(tokens - target["tokens"]) <= 0.2 * target["tokens"] else None
        rows.append(row)
    return rows


def report(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'hook':11s}{'settings':18s}{'responses':>10s}{'tokens':>11s}{'syncs':>7s}{'(other N)':>12s}"
             f"{'ms/call':>9s}{'1 pass':>8s}{'passes':>8s}{'first s':>9s}  verdict"]
    for r in rows:
        verdicts = [f"syncs <= {TARGETS[r['hook']]['syncs']} and constant: {'pass' if r['syncs_ok'] else 'FAIL'}"]
        if r["ms_target"] is not None:
            verdicts.append(f"<= {r['ms_target']} ms: {'pass' if r['ms'] <= r['ms_target'] else 'FAIL'}")
        lines.append(f"{r['hook']:11s}{r['settings']:18s}{r['responses']:10d}{r['tokens']:11,d}{r['syncs']:7d}"
                     f"{str(r['syncs_other']) + ' @' + str(r['responses_other']):>12s}{r['ms']:9.3f}"
                     f"{r['pass_ms']:8.3f}{r['ms'] / r['pass_ms']:8.1f}{r['first_s']:9.1f}  {'; '.join(verdicts)}")
    for r in rows:  # where each synchronisation of a case over budget happened
        if not r["syncs_ok"]:
            for responses, sites in ((r["responses"], r["sync_sites"]), (r["responses_other"], r["sync_sites_other"])):
                lines += [f"  sync, {r['hook']} {r['settings']} @{responses}: {site}" for site in sites]
    return lines


def options(doc: str, repeats: int, unit: str) -> argparse.Namespace:
    """The GPU benchmarks' command line (``doc``: the script's docstring): ``--repeats`` timed calls per ``unit``,
    ``--seed``, ``--json`` (its folder must exist)."""
    summary, details = doc.split("\n\n", 1)
    parser = argparse.ArgumentParser(description=summary, epilog=details,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=REPEATS, default=repeats,
                        help=f"timed calls per {unit} (default {repeats})")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--json", type=Path, help="also write the device and the rows to this JSON file")
    args = parser.parse_args()
    check_output_file(parser, "--json", args.json)
    return args


def on_cuda(script: str, measure_rows: Callable[[], list[dict[str, Any]]], report_rows: Callable[..., list[str]],
            json_path: Path | None) -> None:
    """Quiet the package's log, name the device, measure, print the report, and write the rows to ``json_path``."""
    logging.getLogger("mismatch_ctrl").setLevel(logging.ERROR)
    device = torch.cuda.get_device_name()
    print(f"{script}  {device}  torch {torch.__version__} (CUDA {torch.version.cuda})")
    rows = measure_rows()
    print("\n".join(report_rows(rows)))
    if json_path:
        json_path.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=1))


def main() -> None:
    args = options(__doc__, 20, "case")
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU here: host syncs and GPU time not measured (run it on a GPU machine, e.g. "
              "`make gpu-check`)")
        return
    on_cuda("bench_gpu", lambda: measure(args.repeats, args.seed), report, args.json)


if __name__ == "__main__":
    main()
