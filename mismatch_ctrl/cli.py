"""``mismatch-ctrl``: the command line (also ``python -m mismatch_ctrl``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .errors import ConfigError
from .formatting import shell_command

if TYPE_CHECKING:
    from .lab.training.methods import RunSpec
    from .lab.training.settings import LabSettings


def _check_config(ns: argparse.Namespace) -> int:
    """Validate for the architecture given, else for each one (the YAML may set it): what resolves, per key; then
    the settings that would leave a controller or guard inert (over ``--num-rollout`` rollouts when given): the
    errors the hook's init would raise exit 2, the warnings it would log are printed."""
    from .config import inert_settings, load_config

    given = ns.arch is not None or ns.num_experts is not None or ns.hf_config is not None
    try:
        configs = ([load_config(ns.path, architecture=ns.arch, num_experts=ns.num_experts, hf_config=ns.hf_config)]
                   if given else [load_config(ns.path, architecture=arch) for arch in ("dense", "moe")])
    except ConfigError as exc:
        print(f"mismatch-ctrl check-config: {exc}", file=sys.stderr)
        return 2
    if not given and configs[0] == configs[1]:
        configs = configs[:1]  # the YAML sets its architecture
    elif not given and not configs[0].dcgrpo.enabled:
        configs = [dataclasses.replace(configs[0], architecture=None)]  # only DC-GRPO's defaults depend on it
    found = [inert_settings(config, ns.num_rollout) for config in configs]
    errors, warnings = (list(dict.fromkeys(m for pair in found for m in pair[k])) for k in (0, 1))
    for warning in warnings:
        print(f"mismatch-ctrl check-config: warning: {warning}", file=sys.stderr)
    if errors:
        print(f"mismatch-ctrl check-config: {errors[0]}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps(configs[0].as_dict() if given else {c.architecture or "any": c.as_dict() for c in configs},
                         indent=1))
        return 0
    for config in configs:
        where = "" if given or len(configs) == 1 else " (no --arch / --num-experts / --hf-config: each architecture)"
        print(f"{ns.path}: OK (method {config.name!r}, architecture {config.architecture or 'any'}){where}")
        if config.dcgrpo.enabled:
            print("dcgrpo:\n" + "\n".join(f"  {line}" for line in config.dcgrpo.explain()))
        if config.correction.active:
            preset = f" (preset {config.correction_preset!r})" if config.correction_preset != "none" else ""
            print(f"correction{preset}:\n" +
                  "\n".join(f"  {line}" for line in config.correction.explain()))
        if config.torch_compile:
            print("torch_compile: true (the TIS hook's device work runs as one compiled graph; docs/performance.md)")
    return 0


UNHASHED_HELP = ("count finished run folders whose fingerprint.json records no file hashes (written by a lab before "
                 "hashes were recorded, or with its list removed: their files cannot be checked); without it they are "
                 "refused, naming each")


def _unwritable(exc: OSError, out: str, fix: str) -> int:
    """The lab's message for a file it could not write (the file, the reason, the fix); exit status 2."""
    print(f"mismatch-ctrl lab: {exc.filename or out}: {exc.strerror or exc}; {fix}", file=sys.stderr)
    return 2


def lab_plan(ns: argparse.Namespace) -> tuple[list[RunSpec], LabSettings, tuple[int, ...]]:
    """What ``lab`` would train, from its parsed options (preset and defaults resolved): the ``RunSpec`` of every
    run, the ``LabSettings`` (of the first seed) and the seeds. ValueError or ConfigError naming the option."""
    from .lab.training.methods import RunSpec
    from .lab.sweeps.options import resolve
    from .lab.model.policy import POLICY_KINDS
    from .lab.training.settings import LabSettings, auto_device

    o = resolve(ns)
    experts = POLICY_KINDS[o["policy"]].get("n_experts", 0)
    try:
        runs = RunSpec.expand(o["methods"].split(","), o["quant"].split(","), experts)
    except (ValueError, ConfigError) as exc:
        raise ValueError(f"--methods: {exc}") from None
    settings = LabSettings(task=o["task"], policy=o["policy"], steps=o["steps"], lr=o["lr"], seed=o["seeds"][0],
                           eval_every=o["eval_every"], prompts_per_step=o["prompts"], samples_per_prompt=o["samples"],
                           optimizer_steps=o["num_steps_per_rollout"], dump_details=ns.dump_details,
                           device=auto_device(o["policy"], o["task"]) if ns.device == "auto" else ns.device)
    return runs, settings, o["seeds"]


def _training_options(ns: argparse.Namespace) -> list[str]:
    """The options of ``lab`` given on its command line that only training reads (``--preset``, the settings,
    ``--dump-details``, ``--ray-address``), as flags."""
    from .lab.sweeps.options import LAB_DEFAULTS

    given = [f"--{name.replace('_', '-')}" for name in ("preset", *LAB_DEFAULTS) if getattr(ns, name, None) is not None]
    return given + ["--dump-details"] * ns.dump_details + ["--ray-address"] * (ns.ray_address is not None)


def _lab(ns: argparse.Namespace) -> int:
    from .lab.sweeps.executors import LocalExecutor, RayExecutor
    from .lab.results.console import summary_table
    from .lab.sweeps.run import SweepInterrupted, rewrite_report, run_lab
    from .lab.sweeps.sweep import SweepError

    if ns.report_only:
        training = _training_options(ns)
        if training:
            print(f"mismatch-ctrl lab: --report-only trains nothing, so {', '.join(training)} would be ignored; drop "
                  "them (the report is rewritten from OUT's runs as they were trained)", file=sys.stderr)
            return 2
        try:
            result = rewrite_report(Path(ns.out), shell_command(["mismatch-ctrl", *ns.argv]), ns.trust_unhashed)
        except (ValueError, SweepError) as exc:
            print(f"mismatch-ctrl lab: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            return _unwritable(exc, ns.out, "free space or make --out writable")
        print(f"{summary_table(result.table)}\n\nreport: {result.report}\nplots:  {result.plots[0].parent}/")
        _not_compared(result.missing)
        return 0
    try:
        runs, settings, seeds = lab_plan(ns)
    except (ValueError, ConfigError) as exc:
        print(f"mismatch-ctrl lab: {exc}", file=sys.stderr)
        return 2
    executor = RayExecutor(ns.ray_address) if ns.ray_address is not None else LocalExecutor(ns.jobs)
    try:
        result = run_lab(runs, settings, Path(ns.out), command=shell_command(["mismatch-ctrl", *ns.argv]),
                         cache_dir=ns.cache_dir, seeds=seeds, executor=executor, trust_unhashed=ns.trust_unhashed)
    except SweepError as exc:
        print(f"mismatch-ctrl lab: {exc}", file=sys.stderr)
        return 130 if isinstance(exc, SweepInterrupted) else 2
    except KeyboardInterrupt:
        print(f"mismatch-ctrl lab: interrupted; the finished runs in {ns.out} are kept, rerun the same command to "
              "continue", file=sys.stderr)
        return 130
    except OSError as exc:
        return _unwritable(exc, ns.out, "free space or choose a writable --out / --cache-dir")
    print(f"\n{summary_table(result.table)}\n\nreport: {result.report}\nplots:  {result.plots[0].parent}/")
    _not_compared(result.missing)
    return 0


def _lab_compare(ns: argparse.Namespace) -> int:
    """``mismatch-ctrl lab compare``: pooled differences against GRPO, or interactions with ``--pairs``."""
    from .lab.results.console import interaction_table, pooled_table
    from .lab.results.pooling import interactions, pooled_versus
    from .lab.sweeps.compare import pair_change, read_directories, setting_differences
    from .lab.sweeps.sweep import SweepError

    given = _training_options(ns) + (["--cache-dir"] if ns.cache_dir is not None else []) + [
        flag for flag, default in (("--out", "runs/lab"), ("--device", "auto"), ("--jobs", ns.lab_jobs_default),
                                   ("--report-only", False)) if getattr(ns, flag[2:].replace("-", "_")) != default]
    if given:
        what = "options" if len(given) > 1 else "an option"
        print(f"mismatch-ctrl lab compare: {', '.join(given)}: {what} of `mismatch-ctrl lab` (training), which compare "
              "would ignore; give compare only its own options (`mismatch-ctrl lab compare --help`)", file=sys.stderr)
        return 2
    dirs = ns.directories
    if ns.pairs and len(dirs) % 2:
        print(f"mismatch-ctrl lab compare: --pairs takes directories in pairs A B, got {len(dirs)}", file=sys.stderr)
        return 2
    try:
        table = read_directories(dirs, ns.trust_unhashed or ns.compare_trust_unhashed)
    except SweepError as exc:
        print(f"mismatch-ctrl lab compare: {exc}", file=sys.stderr)
        return 2
    halves = [dirs[::2], dirs[1::2]] if ns.pairs else [dirs]
    mixed = [d for half in halves for d in setting_differences(table.where(*map(str, half)))]
    if mixed and not ns.across_settings:
        print(f"mismatch-ctrl lab compare: runs trained with different settings would be pooled ({'; '.join(mixed)}); "
              "pool one setting at a time, compare two with --pairs A B, or pool across them on purpose with "
              "--across-settings", file=sys.stderr)
        return 2
    changes: list[str] = []
    if ns.pairs:
        pairs = [(str(a), str(b)) for a, b in zip(dirs[::2], dirs[1::2])]
        for a, b in pairs:
            count, change = pair_change(table, a, b)
            if count != 1 and not (count and ns.across_settings):
                what = f"differ in {count} settings ({change})" if count else "were trained under the same settings"
                print(f"mismatch-ctrl lab compare: --pairs compares two settings, but {a} and {b} {what}; " +
                      ("pair directories that differ in one setting, or compare them anyway with --across-settings"
                       if count else "pool them without --pairs"), file=sys.stderr)
                return 2
            changes += [change] if change not in changes else []
        rows = interactions(table, pairs, ns.metric)
        text = interaction_table(rows, ns.metric, pairs) if rows else None
        why = "no run is in both directories of a pair with seeds in both (and, but for GRPO, its grpo@<engine>)"
    else:
        rows = pooled_versus(table, ns.metric, ns.against)
        text = pooled_table(rows, ns.metric, ns.against) if rows else None
        why = ("no run has a GRPO run on its engine (grpo@<engine>) with a seed in common" if ns.against == "grpo" else
               "no run has an exact-engine run (grpo@none or its own @none) with a seed in common")
    if text is None:
        print(f"mismatch-ctrl lab compare: nothing to compare: {why}", file=sys.stderr)
        return 2
    print(text + "".join(f"\n\nB - A: {change}" for change in changes) +
          "".join(f"\n\nPooled across settings: {line}" for line in mixed))
    return 0


def _not_compared(missing: list[str]) -> None:
    """Name on stderr each comparison the report could not make (its reference run is missing): a note, the runs are
    done."""
    for line in missing:
        print(f"mismatch-ctrl lab: note: {line.replace('`', '')} (train the reference run into the same --out to "
              "compare)", file=sys.stderr)


def _analyze(ns: argparse.Namespace) -> int:
    from .analyze import AnalyzeOptions, DumpError, analyze_dumps, write_report
    from .analyze.consistency import warnings_of
    from .analyze.dumps.rollout import is_refusal
    from .analyze.report import not_measured
    from .errors import InputError

    options = AnalyzeOptions(config=ns.config, architecture=ns.arch, num_experts=ns.num_experts,
                             hf_config=ns.hf_config, eps=ns.eps, lambda_0=ns.lambda_0, eta=ns.eta,
                             max_response_len=ns.max_response_len, unsafe_load=ns.unsafe_load,
                             reward_key=ns.reward_key)
    out = Path(ns.out) if ns.out else Path(ns.directory) / "analysis"
    json_path = Path(ns.json) if ns.json not in (None, "-") else None
    try:
        if Path(ns.directory).exists() and not Path(ns.directory).is_dir():
            raise DumpError(f"{ns.directory}: not a directory; give the --dump-details directory of a slime run")
        _check_outputs(out, json_path, create=Path(ns.directory).is_dir())
        result = analyze_dumps(ns.directory, options)
        report = write_report(result, out, command=shell_command(["mismatch-ctrl", *ns.argv]))
        if json_path is not None:
            try:
                json_path.parent.mkdir(parents=True, exist_ok=True)
                json_path.write_text(json.dumps(result, indent=1) + "\n")
            except OSError as exc:
                raise ConfigError(f"--json {json_path}: cannot write it ({exc.strerror or exc}); the report is in "
                                  f"{report}") from None
    except (ConfigError, DumpError, InputError) as exc:
        print(f"mismatch-ctrl analyze: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mismatch-ctrl analyze: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if ns.json == "-":
        print(json.dumps(result, indent=1))
    print(f"report: {report}", file=sys.stderr if ns.json == "-" else sys.stdout)
    for line in warnings_of(result):
        print(f"mismatch-ctrl analyze: warning: {line}", file=sys.stderr)
    counts = result["counts"]
    partial = [row["rollout_id"] for row in result["rollouts"] if any(map(is_refusal, row["notes"]))]
    refused = bool(result["skipped"] or partial)
    if counts["measured"] == 0 and (refused or counts["with_train_log_probs"]):
        why = "dump files were refused" if refused else not_measured(counts)
        print(f"mismatch-ctrl analyze: no rollout could be measured, the report has no discrepancy numbers: {why} "
              "(the report's 'Skipped files and notes' names each file and the reason)", file=sys.stderr)
        return 1
    if result["skipped"] or partial:
        skipped = f"{len(result['skipped'])} dump file(s) or rollout(s) skipped, " if result["skipped"] else ""
        refused_part = (f"{len(partial)} rollout(s) with a refused dump file read from their other dump (rollouts "
                        f"{_id_list(partial)}), " if partial else "")
        print(f"mismatch-ctrl analyze: {skipped}{refused_part}{counts['measured']} rollout(s) measured (the report's "
              "'Skipped files and notes' names each and the reason)", file=sys.stderr)
    return 0


def _id_list(ids: list[int], shown: int = 8) -> str:
    """``0, 3, 5`` or ``0, 3, ... (12 in all)``."""
    text = ", ".join(map(str, ids[:shown]))
    return text if len(ids) <= shown else f"{text}, ... ({len(ids)} in all)"


def _check_outputs(out: Path, json_path: Path | None, create: bool) -> None:
    """Refuse output paths that cannot be written before the analysis spends any time (``create``: make ``out`` now,
    the only sure test; not when the dumps' directory is missing, which the analysis reports)."""
    if str(out) == "-":
        raise ConfigError("--out -: the report is a directory (report.md and plots/); give its path ('-' is only for "
                          "--json)")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory; give a directory for report.md and plots/")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {existing} is not writable")
    try:
        if create:
            out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. under /proc, where root's access check says yes
        raise ConfigError(f"--out {out}: cannot create it ({exc.strerror or exc}); give a writable directory") \
            from None
    if json_path is not None:
        if json_path.is_dir():
            raise ConfigError(f"--json {json_path}: is a directory; give a file name (or '-' for standard output)")
        report = (out / "report.md").resolve()
        if json_path.resolve() == report or (out / "plots").resolve() in json_path.resolve().parents:
            raise ConfigError(f"--json {json_path}: would overwrite the report's own files in {out}; give another "
                              "file name")
        parent = next(p for p in json_path.parents if p.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"--json {json_path}: {parent} is not a writable directory")


def _expert_count(text: str) -> int:
    """``--num-experts``: an integer >= 0 (0: dense), as Megatron's flag."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 (0 or absent: dense), got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mismatch-ctrl",
        description="Control the training-inference mismatch of RL with FP8 rollouts (DC-GRPO, rollout correction, "
                    "length-triggered LR decay).")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"mismatch-ctrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from .lab.sweeps import options

    check = sub.add_parser("check-config", help="validate a method YAML (the file given to --custom-config-path)",
                           description="Validate a YAML with a top-level 'mismatch_ctrl:' key (--json: print every "
                                       "resolved setting). Exit 0 if valid, 2 with a message naming the key "
                                       "otherwise.")
    check.add_argument("path", help="YAML file, e.g. configs/methods/dcgrpo.yaml")
    arch = check.add_mutually_exclusive_group()
    arch.add_argument("--arch", choices=("dense", "moe"), help="architecture for the DC-GRPO defaults")
    arch.add_argument("--num-experts", type=_expert_count, help="Megatron --num-experts of the model (> 0 means MoE)")
    arch.add_argument("--hf-config", help="Hugging Face config.json (or model directory) to read the architecture from")
    check.add_argument("--num-rollout", type=options.positive_int,
                       help="slime's --num-rollout: also refuse what would leave a controller inert over the run, and "
                            "warn about guards that could not act (as the hook's init does)")
    check.add_argument("--json", action="store_true", help="print every resolved setting as JSON")
    check.set_defaults(run=_check_config, command_parser=check)

    from .lab.model.warmup import WARMUP_PRESETS
    from .lab.sweeps.run import default_jobs

    d = options.LAB_DEFAULTS
    lab = sub.add_parser(
        "lab", help="CPU lab: FP8-engine RL on a tiny MoE policy, every method through the slime hooks",
        formatter_class=options.UnbrokenNamesHelpFormatter,
        usage="%(prog)s [options]          (train and report; the options below)\n"
              "       %(prog)s compare DIR [DIR ...] [options]   (pool finished runs: %(prog)s compare --help)",
        description="Warm up a tiny transformer (mixture-of-experts by default) on a verifiable task (cached), then "
                    "train it with GRPO from rollouts of an FP8-quantised copy, once per method and seed, calling "
                    "mismatch_ctrl's slime hooks as slime does. Writes OUT/report.md, OUT/summary.json, "
                    "OUT/plots/*.png and OUT/<run>/seed<k>/metrics.jsonl.")
    presets = "; ".join(f"{name}: " + (", ".join(f"{k} {','.join(map(str, v)) if isinstance(v, tuple) else v}"
                                                 for k, v in values.items()).replace(",", ", ") or "the defaults")
                        for name, values in sorted(options.LAB_PRESETS.items()))
    lab.add_argument("--preset", choices=sorted(options.LAB_PRESETS),
                     help=f"named settings, explicit flags override them ({presets})")
    from .lab.training.methods import method_names

    lab.add_argument("--methods", help="comma list of runs METHOD[@QUANT][+r3]; METHOD is a configs/methods file or a "
                                       f"lab variant ({', '.join(method_names())}); @QUANT pins the run's engine, "
                                       "otherwise the run is repeated for every --quant engine; +r3: rollout routing "
                                       f"replay (needs a MoE --policy) (default: {d['methods']})")
    lab.add_argument("--quant", type=options.quant_list,
                     help="comma list of rollout engines (doses) for runs without @QUANT: runs = methods x engines x "
                          "seeds, paired by seed. Engines: none (exact fp32), bf16, e4m3 (FP8 weights, activations "
                          "and LM head), e4m3-w (FP8 weights only), e5m2, e5m2-w, nvfp4 (E2M1, E4M3 scale per 16, fp32 "
                          "scale per tensor), mxfp4 (E2M1, power-of-two scale per 32), int4 (weights in groups of "
                          "128), tempX (exact weights, engine logits divided by X: the continuous dose, e.g. "
                          "temp1.01); suffix +router also quantises the MoE router, +tempX adds the engine "
                          "temperature to a quantised engine, e.g. nvfp4+router, e4m3+temp1.05 (default: "
                          f"{d['quant']})")
    lab.add_argument("--policy", type=options.policy_kind,
                     help="moe (8 experts of width 32, top-2 per token) or dense (MLP of width 256): 105,664 / "
                          "103,744 parameters; moe-large (4 layers of width 256, 16 experts of width 128, top-2: 5.3M "
                          f"parameters, for a GPU) (default: {d['policy']})")
    lab.add_argument("--task", choices=sorted(WARMUP_PRESETS),
                     help="add (reversed addition, ~5-token answers), reverse (32-64-token answers) or reverse-long "
                          f"(64-128-token answers: the long-answer regime) (default: {d['task']})")
    lab.add_argument("--steps", type=options.positive_int,
                     help=f"rollouts (training iterations) per run (default: {d['steps']})")
    per_policy = "".join(f"; {own['lr']:g} for {kind}" for kind, own in options.POLICY_DEFAULTS.items() if "lr" in own)
    lab.add_argument("--lr", type=options.learning_rate, help=f"Adam learning rate (default: {d['lr']:g}{per_policy})")
    lab.add_argument("--num-steps-per-rollout", type=options.positive_int,
                     help="optimizer steps per rollout, K >= 1 (slime's name): the rollout is split into K batches, "
                          "so steps 2..K train off-policy (default: "
                          f"{d['num_steps_per_rollout']})")
    lab.add_argument("--device", type=options.device_name, default="auto",
                     help="auto (cuda for a policy of 1M parameters or more when torch finds a CUDA GPU - the "
                          "gpu-moe preset's moe-large - else cpu, which runs the small policies faster), cpu or cuda "
                          "(default: auto)")
    lab.add_argument("--seeds", type=options.seed_list,
                     help="comma list of seeds; each seeds a warm-up and one run of every method, and the report "
                          f"gives mean and 95%% interval over them (default: {','.join(map(str, d['seeds']))})")
    lab.add_argument("--prompts", type=options.prompt_count,
                     help=f"prompts per rollout, at most {options.MAX_PROMPTS} (default: {d['prompts']})")
    lab.add_argument("--samples", type=options.group_size,
                     help=f"samples per prompt, 2 to {options.MAX_SAMPLES} (default: {d['samples']})")
    lab.add_argument("--eval-every", type=options.positive_int,
                     help=f"rollouts between held-out evaluations (default: {d['eval_every']})")
    lab.set_defaults(lab_jobs_default=default_jobs())
    lab.add_argument("--jobs", type=options.positive_int, default=default_jobs(),
                     help="runs trained in parallel on this machine, one thread each (default: the number of CPU "
                          "cores; ignored with --ray-address)")
    lab.add_argument("--ray-address", metavar="ADDR", type=options.ray_address,
                     help="train the runs as Ray tasks on the cluster at ADDR (HOST:PORT as `ray start --head` prints "
                          "it, ray://HOST:PORT, or auto for the local cluster), one CPU each (one GPU with a cuda "
                          "device); needs pip install 'mismatch-ctrl[ray]'. Default: local processes (--jobs)")
    lab.add_argument("--out", type=options.directory, default="runs/lab", help="output directory (default: runs/lab)")
    lab.add_argument("--dump-details", action="store_true",
                     help="also write each rollout's batch in slime's --dump-details format to OUT/<run>/seed<k>/dump/ "
                          "(input of mismatch-ctrl analyze)")
    lab.add_argument("--report-only", action="store_true",
                     help="train nothing: write OUT's summary, report and plots again from its runs' metrics")
    lab.add_argument("--cache-dir", type=options.directory,
                     help="warm-up cache directory (default $MISMATCH_CTRL_CACHE/lab or ~/.cache/mismatch_ctrl/lab)")
    lab.add_argument("--trust-unhashed", action="store_true", help=UNHASHED_HELP)
    lab.set_defaults(run=_lab, command_parser=lab)
    from .lab.results.frontier import VERSUS

    lab_commands = lab.add_subparsers(dest="lab_command", metavar="compare")
    compare = lab_commands.add_parser(
        "compare", prog=f"{lab.prog} compare",
        help="pool finished runs over several --out directories, or pair two settings",
        description="Read the runs of lab output directories once (every run folder checked as --report-only checks "
                    "it) and compare each controller with GRPO on its engine, paired per seed: per directory and "
                    "pooled over them (their seeds differ, so the pairs are independent), or, with --pairs, its gain "
                    "over GRPO in A and in B and the interaction B - A (directories in pairs A B that differ in one "
                    "setting; more pairs, of other seeds, are pooled). A run counts once: a directory given twice, a "
                    "copied run, or one run in two directories is refused. Prints a markdown table.")
    compare.add_argument("directories", nargs="+", type=Path, metavar="DIR",
                         help="lab output directories (the --out of mismatch-ctrl lab)")
    compare.add_argument("--metric", default="late_acc_engine", choices=[key for key, _ in VERSUS],
                         help="the per-run number compared (default: late_acc_engine)")
    compare.add_argument("--against", choices=("grpo", "exact"), default="grpo",
                         help="the reference of each run: grpo (GRPO on the same engine, grpo@<engine>: what a "
                              "controller adds) or exact (grpo@none, else the run's own @none: what the engine's "
                              "mismatch costs, as the frontier) (default: grpo; --pairs always uses grpo)")
    compare.add_argument("--pairs", action="store_true",
                         help="directories in pairs A B (A: the reference setting, B: one setting changed): gains in "
                              "A and B and their difference per run")
    compare.add_argument("--across-settings", action="store_true",
                         help="pool directories trained with different settings (e.g. the MoE and the dense policy; "
                              "the lab settings, the warm-up and each method's configuration, as the runs' "
                              "fingerprints record them) on purpose, or, with --pairs, pairs A B that differ in more "
                              "than one setting; the table names the differences. Without it they are refused")
    compare.add_argument("--trust-unhashed", dest="compare_trust_unhashed", action="store_true", help=UNHASHED_HELP)
    compare.set_defaults(run=_lab_compare, command_parser=compare)

    from .analyze.analysis import eps_option, number_option

    analyze = sub.add_parser(
        "analyze", help="calibrate eps and preview every controller on a slime run's --dump-details dumps",
        description="Read the dumps of a slime run (--dump-details DIR: DIR/train_data/{rollout_id}.pt and "
                    "DIR/rollout_data/{rollout_id}.pt) one rollout at a time; measure the training-inference "
                    "discrepancy per rollout, recommend eps, replay the DC-GRPO controller and the surge detector, "
                    "and give each IS/RS preset's rejections. Writes OUT/report.md and OUT/plots/*.png.")
    analyze.add_argument("directory", help="the --dump-details directory (or a directory of train dumps)")
    analyze.add_argument("--out", help="output directory (default DIRECTORY/analysis)")
    analyze_arch = analyze.add_mutually_exclusive_group()
    analyze_arch.add_argument("--arch", choices=("dense", "moe"), help="architecture for the DC-GRPO defaults "
                                                                       "(default moe, the recipe's model)")
    analyze_arch.add_argument("--num-experts", type=_expert_count,
                              help="Megatron --num-experts of the model (> 0 means MoE)")
    analyze_arch.add_argument("--hf-config", help="Hugging Face config.json (or model directory) of the model")
    analyze.add_argument("--config", help="method YAML (or the name of one in configs/methods/) whose dcgrpo and "
                                          "lr_decay settings drive the replay (default dcgrpo_length_decay)")
    analyze.add_argument("--eps", type=eps_option, help="DC-GRPO budget for the replay: a number in (0, 1) or 'auto'")
    analyze.add_argument("--lambda-0", type=number_option(0.0), help="initial DC-GRPO multiplier for the replay (>= 0)")
    analyze.add_argument("--eta", type=number_option(0.0, strict=True), help="dual step size for the replay (> 0)")
    analyze.add_argument("--max-response-len", type=options.positive_int,
                         help="slime's --rollout-max-response-len: truncation rate (when the dump does not record "
                              "truncation) and the surge detector's cap (default: the longest truncated response)")
    analyze.add_argument("--reward-key", help="slime's --reward-key: the entry of dict rewards to report (rollout "
                                              "dumps; train dumps hold the chosen reward already)")
    analyze.add_argument("--json", metavar="PATH", help="also write every number of the report as JSON to PATH "
                                                        "('-': standard output)")
    analyze.add_argument("--unsafe-load", action="store_true",
                         help="load the dumps with torch.load(weights_only=False), as slime itself does: a crafted "
                              "dump can then run arbitrary code on this machine. Only for dumps of your own runs that "
                              "the default safe load refuses (the error names the type it met)")
    analyze.set_defaults(run=_analyze, command_parser=analyze)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help()
        return 2
    ns, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse names a subcommand's unknown option under the top-level usage: give the subcommand's
        ns.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    ns.argv = list(sys.argv[1:] if argv is None else argv)  # recorded by lab and analyze (shell_command)
    try:
        return ns.run(ns)
    except BrokenPipeError:  # the reader of standard output went away (`analyze --json - | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
