"""The options of every ``mismatch-ctrl`` command (``--help``), each bound to the function that runs it."""

from __future__ import annotations

import argparse
from pathlib import Path

from .analyze import analyze_command
from .check_config import check_config_command
from .lab import compare_command, lab_command


UNHASHED_HELP = ("count finished run folders whose fingerprint.json records no file hashes (written by a lab before "
                 "hashes were recorded, or with its list removed: their files cannot be checked); without it they are "
                 "refused, naming each")


def expert_count(text: str) -> int:
    """``--num-experts``: an integer >= 0 (0: dense), as Megatron's flag."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 (0 or absent: dense), got {text!r}")
    return value


def file_path(text: str) -> str:
    """A path to a file: not empty (an unset shell variable; ``Path("")`` would read as the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty (an unset variable?); give the path of a file")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mismatch-ctrl",
        description="Control the training-inference mismatch of RL with FP8 rollouts (DC-GRPO, rollout correction, "
                    "length-triggered LR decay).")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"mismatch-ctrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from ..lab.sweeps import options

    check = sub.add_parser("check-config", help="validate a method YAML (the file given to --custom-config-path)",
                           description="Validate a YAML with a top-level 'mismatch_ctrl:' key (--json: print every "
                                       "resolved setting). Exit 0 if valid, 2 with a message naming the key "
                                       "otherwise.")
    check.add_argument("path", type=file_path, help="YAML file, e.g. configs/methods/dcgrpo.yaml")
    arch = check.add_mutually_exclusive_group()
    arch.add_argument("--arch", choices=("dense", "moe"), help="architecture for the DC-GRPO defaults")
    arch.add_argument("--num-experts", type=expert_count, help="Megatron --num-experts of the model (> 0 means MoE)")
    arch.add_argument("--hf-config", type=file_path,
                      help="Hugging Face config.json (or model directory) to read the architecture from")
    check.add_argument("--num-rollout", type=options.positive_int,
                       help="slime's --num-rollout: also refuse what would leave a controller inert over the run, and "
                            "warn about guards that could not act (as the hook's init does)")
    check.add_argument("--json", action="store_true", help="print every resolved setting as JSON")
    check.set_defaults(run=check_config_command, command_parser=check)

    from ..lab.model.warmup import WARMUP_PRESETS
    from ..lab.sweeps.run import default_jobs

    d = options.LAB_DEFAULTS
    lab = sub.add_parser(
        "lab", help="CPU lab: FP8-engine RL on a tiny MoE policy, every method through the slime hooks",
        formatter_class=options.UnbrokenNamesHelpFormatter,
        usage="%(prog)s [options]          (train and report; the options below)\n"
              "       %(prog)s compare DIR [DIR ...] [options]   (pool finished runs: %(prog)s compare --help)",
        description="Warm up a tiny transformer (mixture-of-experts by default) on a verifiable task (cached), then "
                    "train it with GRPO from rollouts of an FP8-quantised copy, once per method and seed, calling "
                    "mismatch_ctrl's slime hooks as slime does. Writes OUT/report.md, OUT/summary.json, "
                    "OUT/plots/*.png and OUT/<run>/seed<k>/metrics.jsonl.",
        epilog="The same run through the verl adapter, beside the slime one (needs make verl-venv): "
               ".venv-verl/bin/python -m mismatch_ctrl.lab.sweeps.verl_compare --help")
    presets = "; ".join(f"{name}: " + (", ".join(f"{k} {','.join(map(str, v)) if isinstance(v, tuple) else v}"
                                                 for k, v in values.items()).replace(",", ", ") or "the defaults")
                        for name, values in sorted(options.LAB_PRESETS.items()))
    lab.add_argument("--preset", choices=sorted(options.LAB_PRESETS),
                     help=f"named settings, explicit flags override them ({presets})")
    from ..lab.training.methods import method_names

    lab.add_argument("--methods", help="comma list of runs METHOD[@QUANT][+r3]; METHOD is a configs/methods file or a "
                                       f"lab variant ({', '.join(method_names())}); @QUANT pins the run's engine, "
                                       "otherwise the run is repeated for every --quant engine; +r3: rollout routing "
                                       f"replay (needs a MoE --policy) (default: {d['methods']})")
    lab.add_argument("--quant", type=options.quant_list,
                     help="comma list of rollout engines (doses) for runs without @QUANT: runs = methods x engines x "
                          "seeds, paired by seed. Engines: none (exact fp32), bf16, fp16, e4m3 (FP8 weights, "
                          "activations and LM head), e4m3-w (FP8 weights only), e5m2, e5m2-w, nvfp4 (E2M1, E4M3 scale "
                          "per 16, fp32 scale per tensor), mxfp4 (E2M1, power-of-two scale per 32), int4 (weights in "
                          "groups of 128), tempX (exact weights, engine logits divided by X: the continuous dose, e.g. "
                          "temp1.01); suffix +router also quantises the MoE router, +tempX adds the engine "
                          "temperature to a quantised engine, e.g. nvfp4+router, e4m3+temp1.05; +train-bf16 / "
                          "+train-fp16 trains in that precision instead of fp32 (FP16 with Megatron's loss "
                          "scaling), e.g. fp16+train-fp16 and bf16+train-bf16: FP16 and BF16 everywhere (default: "
                          f"{d['quant']})")
    lab.add_argument("--policy", type=options.policy_kind,
                     help="moe (8 experts of width 32, top-2 per token) or dense (MLP of width 256): 105,664 / "
                          "103,744 parameters; moe-large (4 layers of width 256, 16 experts of width 128, top-2: 5.3M "
                          f"parameters, for a GPU) (default: {d['policy']})")
    lab.add_argument("--task", choices=sorted(WARMUP_PRESETS),
                     help="add (reversed addition, ~5-token answers), reverse (32-64-token answers), reverse-long "
                          "(64-128-token answers: the long-answer regime) or digitsum (a scratchpad RL learns to use: "
                          f"the response-length surge) (default: {d['task']})")
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
    lab.set_defaults(run=lab_command, command_parser=lab)
    from ..lab.results.frontier import VERSUS

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
    compare.add_argument("--against", type=options.reference_run, default="grpo",
                         help="the reference of each run: grpo (GRPO on the same engine, grpo@<engine>: what a "
                              "controller adds), exact (grpo@none, else the run's own @none: what the engine's "
                              "mismatch costs, as the frontier) or a run label such as grpo@fp16+train-fp16 (each "
                              "run against that run of its directory) (default: grpo; --pairs always uses grpo)")
    compare.add_argument("--pairs", action="store_true",
                         help="directories in pairs A B (A: the reference setting, B: one setting changed): gains in "
                              "A and B and their difference per run")
    compare.add_argument("--across-settings", action="store_true",
                         help="pool directories trained with different settings (e.g. the MoE and the dense policy; "
                              "the lab settings, the warm-up and each method's configuration, as the runs' "
                              "fingerprints record them) on purpose, or, with --pairs, pairs A B that differ in more "
                              "than one setting; the table names the differences. Without it they are refused")
    compare.add_argument("--trust-unhashed", dest="compare_trust_unhashed", action="store_true", help=UNHASHED_HELP)
    compare.set_defaults(run=compare_command, command_parser=compare)

    from ..analyze.analysis import eps_option, number_option

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
    analyze_arch.add_argument("--num-experts", type=expert_count,
                              help="Megatron --num-experts of the model (> 0 means MoE)")
    analyze_arch.add_argument("--hf-config", type=file_path,
                              help="Hugging Face config.json (or model directory) of the model")
    analyze.add_argument("--config", type=file_path,
                         help="method YAML (or the name of one in configs/methods/) whose dcgrpo and "
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
    analyze.set_defaults(run=analyze_command, command_parser=analyze)
    return parser
