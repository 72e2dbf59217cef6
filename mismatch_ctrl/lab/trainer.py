"""GRPO on the tiny policy, driven exactly the way slime drives ``mismatch_ctrl``'s hooks.

One rollout (= one training iteration), as in slime with ``--colocate``:

1. the rollout engine (quantised copy of the policy) samples ``prompts x samples`` responses with its own log-probs
   (and, for a mixture-of-experts policy, its expert sets);
2. rewards are group-normalised (``(r - mean) / (std + 1e-6)`` per prompt, slime's GRPO default);
3. the fp32 policy recomputes the old-policy log-probs (Megatron's recompute, forced by ``--get-mismatch-metrics``);
   with routing replay (R3) this recompute and the training forwards use the engine's expert sets;
4. ``hooks.advantages(args, rollout_data)`` once, with slime-shaped ``args`` and ``rollout_data``;
5. per optimizer step ``hooks.before_train_step``; per micro-batch the PPO clipped surrogate, then
   ``hooks.rollout_correction`` and slime's reduction (per-sample mean with the returned masks in the numerator and
   the original mask counts as denominators, divided by the global batch size);
6. Adam step, then the weight sync re-quantises the engine.

The hooks get slime's ``args`` with ``num_experts`` = the policy's expert count, so DC-GRPO resolves its
per-architecture defaults exactly as on the cluster. With ``dump_details`` each rollout's batch is also written in
slime's ``--dump-details`` format (``<run>/dump/train_data/<rollout>.pt``), which ``mismatch-ctrl analyze`` reads.
"""

from __future__ import annotations

import json
import math
import time
from argparse import Namespace
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ..analyze.dumps import samples_from_rollout_data, write_train_dump
from ..batch import Segments
from ..slime import hooks
from ..slime.names import ADVANTAGE_HOOK, INIT_HOOK, LR_HOOK, TIS_HOOK
from .engine import RolloutEngine
from .methods import RunSpec, method_section
from .policy import POLICY_KINDS, PolicyConfig, TinyPolicy
from .routing import routing_metrics
from .task import TASKS, make_task

PREFIX = "mismatch_ctrl/"
RUN_FILE = "run.json"
LAYER_FLIPS = "routing_flip_fraction_layer"


@dataclass(frozen=True)
class LabSettings:
    """Everything but the method and the quantisation mode that defines a lab run."""

    task: str = "add"
    policy: str = "moe"
    steps: int = 200
    lr: float = 1e-3
    seed: int = 0
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    optimizer_steps: int = 2
    micro_batches: int = 2
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    temperature: float = 1.0
    max_new_tokens: int | None = None
    eval_every: int = 20
    eval_prompts: int = 256
    collapse_window: int = 10
    dump_details: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.optimizer_steps < 1 or self.micro_batches < 1:
            raise ValueError(f"num_steps_per_rollout (optimizer steps per rollout) and micro_batches must be >= 1, got "
                             f"{self.optimizer_steps} and {self.micro_batches}")
        batch = self.prompts_per_step * self.samples_per_prompt
        if batch % (self.optimizer_steps * self.micro_batches):
            raise ValueError(f"prompts_per_step x samples_per_prompt ({batch}) must be a multiple of "
                             f"num_steps_per_rollout x micro_batches ({self.optimizer_steps} x {self.micro_batches}); "
                             "change --prompts, --samples or --num-steps-per-rollout")
        for name in ("steps", "prompts_per_step", "eval_every", "eval_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.task not in TASKS:
            raise ValueError(f"task: unknown {self.task!r}; choose one of {sorted(TASKS)}")
        if self.policy not in POLICY_KINDS:
            raise ValueError(f"policy: unknown kind {self.policy!r}; choose one of {sorted(POLICY_KINDS)}")
        if self.samples_per_prompt < 2:
            raise ValueError("samples_per_prompt must be >= 2 (GRPO normalises rewards within a prompt's group)")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")
        if self.device not in DEVICES:
            raise ValueError(f"device: expected one of {list(DEVICES)}, got {self.device!r}")

    @property
    def global_batch_size(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt // self.optimizer_steps


DEVICES = ("cpu", "cuda")


def check_device(device: str) -> None:
    """Refuse a device the lab cannot run on: not ``cpu`` / ``cuda``, or ``cuda`` without a CUDA GPU."""
    if device not in DEVICES:
        raise ValueError(f"device: expected one of {list(DEVICES)}, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda requested but torch finds no CUDA GPU (torch "
                         f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'}); use --device cpu or auto")


CUDA_MIN_PARAMETERS = 1_000_000
"""``--device auto`` trains a policy of at least this many parameters on CUDA (when torch finds a GPU) and a smaller
one on the CPU. Measured on one H200 (GPU_NOTES, 2026-11-26): the 105,664-parameter ``moe`` policy ran 20 rollouts
with its warm-up in 17.2 s on CUDA against 13.8 s on the CPU (its kernels are too small to fill a GPU, so launches
and host synchronisations dominate), while the 5.3M-parameter ``moe-large`` is sized for a GPU. ``make gpu-check``
measures both policies on both devices and says whether this rule picked the faster one."""


def auto_device(policy: str, task: str) -> str:
    """What ``--device auto`` runs ``policy`` on (see :data:`CUDA_MIN_PARAMETERS`)."""
    if not torch.cuda.is_available():
        return "cpu"
    size = TinyPolicy(PolicyConfig.of_kind(policy, make_task(task))).num_parameters()
    return "cuda" if size >= CUDA_MIN_PARAMETERS else "cpu"


class ConstantLRScheduler:
    """The part of Megatron's ``OptimizerParamScheduler`` the hooks rely on, constant decay style: each group's LR
    is its ``max_lr`` (slime with ``--lr-decay-style constant``)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.num_steps = 0

    def get_lr(self, param_group: dict[str, Any]) -> float:
        return param_group["max_lr"]

    def step(self, increment: int) -> None:
        self.num_steps += increment
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr(group)


def slime_args(spec: RunSpec, settings: LabSettings, max_response_len: int, state_dir: Path | None,
               num_experts: int = 0) -> Namespace:
    """The ``args`` slime would pass to the hooks for this run (the YAML's keys merged, our hook paths set, Megatron's
    ``num_experts`` from the policy, slime's ``use_rollout_routing_replay`` for R3)."""
    return Namespace(
        mismatch_ctrl=method_section(spec.method),
        num_experts=num_experts, use_rollout_routing_replay=spec.replay,
        save=str(state_dir) if state_dir else None, load=None, finetune=False, start_rollout_id=0,
        save_interval=None, num_rollout=settings.steps,
        lr=settings.lr, min_lr=0.0,
        custom_advantage_function_path=ADVANTAGE_HOOK,
        custom_tis_function_path=TIS_HOOK,
        custom_megatron_before_train_step_hook_path=LR_HOOK,
        custom_megatron_init_path=INIT_HOOK,
        get_mismatch_metrics=True, use_tis=False, advantage_estimator="grpo", normalize_advantages=False,
        rollout_max_response_len=max_response_len, rollout_temperature=settings.temperature,
        rollout_batch_size=settings.prompts_per_step, n_samples_per_prompt=settings.samples_per_prompt,
        global_batch_size=settings.global_batch_size, eps_clip=settings.eps_clip, eps_clip_high=settings.eps_clip_high,
    )


def group_normalize(rewards: Tensor, group: int) -> Tensor:
    """slime's GRPO reward normalisation: per prompt, ``(r - mean) / (std + 1e-6)``."""
    grouped = rewards.reshape(-1, group)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    return (centered / (grouped.std(dim=1, keepdim=True) + 1e-6)).reshape(-1)


def policy_loss(ppo_kl: Tensor, advantages: Tensor, eps_clip: float, eps_clip_high: float) -> Tensor:
    """PPO clipped surrogate per token (slime's ``compute_policy_loss``): ``max(-A r, -A clip(r, 1-e, 1+e_high))``."""
    ratio = torch.exp(-ppo_kl)
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high))


def token_mean_metrics(metrics: dict[str, Tensor], segments: Segments, mask: Tensor) -> dict[str, float]:
    """slime's reduction of TIS metrics (``sum_of_sample_mean`` over the number of samples): per-sample masked mean
    ``sum_t m x / max(sum_t m, 1)``, then the mean over all samples."""
    counts = segments.sum(mask)[:, 0].clamp_min(1.0)
    return {name: float((segments.sum(value * mask)[:, 0] / counts).mean()) for name, value in metrics.items()}


def collapse_step(rewards: list[float], window: int) -> int | None:
    """First step where the trailing ``window``-step mean training reward falls below half its best so far (a best
    of at least 0.1) and never recovers above three quarters of it [ours]."""
    best, candidate, total = 0.0, None, 0.0
    for i, reward in enumerate(rewards):
        total += reward - (rewards[i - window] if i >= window else 0.0)
        value = total / min(i + 1, window)
        if candidate is not None and value >= 0.75 * best:
            candidate = None
        best = max(best, value)
        if candidate is None and best >= 0.1 and value < 0.5 * best:
            candidate = i
    return candidate


def blow_up_step(records: list[dict[str, Any]]) -> int | None:
    """First rollout whose engine logits turned NaN or infinite in some sample (a blown-up policy), else None."""
    return next((i for i, r in enumerate(records) if r.get("engine_nonfinite_fraction", 0.0) > 0), None)


class Trainer:
    """One lab run: a policy, its rollout engine, an optimizer and the slime-shaped arguments of the hooks."""

    def __init__(self, spec: RunSpec, settings: LabSettings, policy_state: dict[str, Any], out_dir: Path) -> None:
        torch.manual_seed(settings.seed)
        self.spec, self.settings, self.out_dir = spec, settings, out_dir
        self.task = make_task(settings.task, seed=settings.seed)
        check_device(settings.device)
        self.device = torch.device(settings.device)
        self.policy = TinyPolicy(PolicyConfig(**policy_state["policy_config"]))
        self.policy.load_state_dict(policy_state["state_dict"])
        self.policy.to(self.device)
        expected = "moe" if POLICY_KINDS[settings.policy].get("n_experts") else "dense"
        if self.policy.config.kind != expected:
            raise ValueError(f"policy: the settings say {settings.policy!r} but the weights are of a "
                             f"{self.policy.config.kind!r} policy")
        if spec.replay and not self.policy.config.n_experts:
            raise ValueError(f"run {spec.label!r}: routing replay needs a mixture-of-experts policy")
        self.engine = RolloutEngine(self.policy, spec.quant)
        self.reference = RolloutEngine(self.policy, "none")
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=settings.lr)
        for group in self.optimizer.param_groups:
            group.update(max_lr=settings.lr, min_lr=0.0)
        self.scheduler = ConstantLRScheduler(self.optimizer)
        self.max_new = settings.max_new_tokens or self.task.generation_len
        self.args = slime_args(spec, settings, self.max_new, out_dir / "state", self.policy.config.n_experts)
        hooks.on_megatron_init(self.args)
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.sampler = (self.generator if self.device.type == "cpu"
                        else torch.Generator(self.device).manual_seed(settings.seed))
        self.eval_prompts = self.task.eval_prompts(settings.eval_prompts).to(self.device)

    def evaluate(self) -> dict[str, float]:
        """Greedy exact-match accuracy on held-out prompts: FP8 engine (deployed) and fp32 policy."""
        self.reference.sync(self.policy)
        out = {}
        for name, engine in (("eval_acc_engine", self.engine), ("eval_acc_fp32", self.reference)):
            rollout = engine.greedy(self.eval_prompts, self.max_new)
            out[name] = float(self.task.reward(rollout.prompts.cpu(), rollout.responses.cpu()).mean())
        return out

    def replay(self, rollout: Any, index: list[int] | None = None) -> Tensor | None:
        """The engine's expert sets the trainer's forward must use (R3 runs), else None."""
        if not self.spec.replay:
            return None
        return rollout.routing if index is None else rollout.routing[index]

    def rollout_data(self, step: int) -> tuple[dict[str, Any], Any, Tensor, dict[str, float | None]]:
        """Sample one rollout and build slime's ``rollout_data`` (DP-local = everything, CP = 1); also the routing
        metrics of a mixture-of-experts policy (the trainer's recompute against the engine's expert sets)."""
        s = self.settings
        prompts = self.task.make_prompts(s.prompts_per_step, self.generator).to(self.device)
        rollout = self.engine.generate(prompts, s.samples_per_prompt, s.temperature, self.max_new, self.sampler)
        raw = self.task.reward(rollout.prompts.cpu(), rollout.responses.cpu())
        mask = rollout.response_mask
        with torch.inference_mode():
            old, routing, _ = self.policy.score(rollout.tokens, rollout.prompt_len, mask, s.temperature,
                                                self.replay(rollout))
        routed: dict[str, float | None] = {}
        if routing is not None:
            prob_diff = (old.exp() - rollout.rollout_log_probs.exp()).abs()
            routed = routing_metrics(routing, rollout.routing, rollout.prompt_len, mask & prob_diff.isfinite(),
                                     prob_diff)
        lengths = rollout.response_lengths.tolist()
        segments = Segments(lengths, self.device)
        data = {
            "rewards": group_normalize(raw, s.samples_per_prompt).tolist(),
            "raw_reward": raw.tolist(),
            "response_lengths": lengths,
            "total_lengths": [rollout.prompt_len + n for n in lengths],
            "loss_masks": [torch.ones(n, dtype=torch.int, device=self.device) for n in lengths],
            "rollout_log_probs": segments.split(rollout.rollout_log_probs[mask]),
            "log_probs": segments.split(old[mask].clone()),
            "kl": [torch.zeros(n, device=self.device) for n in lengths],
            "truncated": rollout.truncated.long().tolist(),
        }
        return data, rollout, raw, routed

    def train_rollout(self, step: int, data: dict[str, Any], rollout: Any) -> dict[str, float]:
        """The optimizer steps of one rollout; returns the hook's train metrics averaged like slime logs them."""
        s = self.settings
        order = torch.randperm(len(data["rewards"]), generator=self.generator)
        per_step = order.numel() // s.optimizer_steps
        train_metrics: dict[str, list[float]] = {}
        for opt_step in range(s.optimizer_steps):
            hooks.before_train_step(self.args, step, opt_step, [self.policy], self.optimizer, self.scheduler)
            self.optimizer.zero_grad(set_to_none=True)
            chunk = order[opt_step * per_step:(opt_step + 1) * per_step]
            for micro in chunk.chunk(s.micro_batches):
                for name, value in self._micro_batch(micro.tolist(), data, rollout).items():
                    train_metrics.setdefault(name, []).append(value)
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
            train_metrics.setdefault("lr", []).append(self.optimizer.param_groups[0]["lr"])
            self.optimizer.step()
            self.scheduler.step(s.global_batch_size)
        self.engine.sync(self.policy)
        return {name: sum(values) / len(values) for name, values in train_metrics.items()}

    def _micro_batch(self, index: list[int], data: dict[str, Any], rollout: Any) -> dict[str, float]:
        s = self.settings

        def pick(key: str) -> list[Any]:
            return [data[key][i] for i in index]

        lengths = pick("response_lengths")
        segments = Segments(lengths, self.device)
        mask = rollout.response_mask[index]
        new = self.policy.score(rollout.tokens[index], rollout.prompt_len, mask, s.temperature,
                                self.replay(rollout, index)).log_probs[mask]
        old = torch.cat(pick("log_probs"))
        advantages = torch.cat(pick("advantages"))
        pg_loss = policy_loss(old - new, advantages, s.eps_clip, s.eps_clip_high)
        loss_masks = pick("loss_masks")
        pg_loss, masks, metrics = hooks.rollout_correction(
            self.args, pg_loss=pg_loss, train_log_probs=pick("log_probs"), rollout_log_probs=pick("rollout_log_probs"),
            loss_masks=loss_masks, total_lengths=pick("total_lengths"), response_lengths=lengths)
        kept = torch.cat(masks).float()
        denominators = segments.sum(torch.cat(loss_masks).float())[:, 0].clamp_min(1.0)
        loss = (segments.sum(pg_loss * kept)[:, 0] / denominators).sum() / s.global_batch_size
        loss.backward()
        return token_mean_metrics(metrics, segments, torch.cat(loss_masks).float())

    def run(self, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Train for ``settings.steps`` rollouts; write ``run.json`` (the run and its settings) and
        ``metrics.jsonl``; return the run's summary."""
        s = self.settings
        self.out_dir.mkdir(parents=True, exist_ok=True)
        run_info = {"method": self.spec.method, "quant": self.spec.quant, "replay": self.spec.replay,
                    "settings": asdict(s)}
        (self.out_dir / RUN_FILE).write_text(json.dumps(run_info, indent=1) + "\n")
        start = time.perf_counter()
        records = []
        with open(self.out_dir / "metrics.jsonl", "w") as log:
            for step in range(s.steps):
                record: dict[str, Any] = {"step": step}
                if step % s.eval_every == 0:
                    record.update(self.evaluate())
                data, rollout, raw, routed = self.rollout_data(step)
                hooks.advantages(self.args, data)
                if s.dump_details:
                    write_train_dump(self.out_dir / "dump", step, *samples_from_rollout_data(data))
                record.update(reward=float(raw.mean()), response_length=float(rollout.response_lengths.float().mean()),
                              truncated_fraction=float(rollout.truncated.float().mean()),
                              engine_nonfinite_fraction=float(rollout.nonfinite.float().mean()), **routed)
                record.update({k[len(PREFIX):]: v[0] for k, v in data.items() if k.startswith(PREFIX)})
                record.update({f"train/{k}": v for k, v in self.train_rollout(step, data, rollout).items()})
                if step == s.steps - 1:
                    record.update({f"final_{k}": v for k, v in self.evaluate().items()})
                record["seconds"] = time.perf_counter() - start
                records.append(record)
                log.write(json.dumps(record) + "\n")
                log.flush()
                if progress is not None:
                    progress(1)
        return summarize(self.spec, s, records)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(spec: RunSpec, settings: LabSettings, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the report: accuracies (start, final, best, and ``late``: the mean over the evaluations of the last
    quarter of the rollouts and the final one), reward, discrepancy (mean, max, first and last quarter), routing
    flips, collapse step (``collapse_step`` on the rewards or ``blow_up_step``, whichever comes first), the share of
    samples whose engine logits turned non-finite (a blown-up policy) and wall
    time of a run."""
    evals = [r for r in records if "eval_acc_engine" in r]
    last = records[-1]
    evals.append({"step": len(records), "eval_acc_engine": last["final_eval_acc_engine"],
                  "eval_acc_fp32": last["final_eval_acc_fp32"]})
    quarter = max(1, len(records) // 4)
    late_evals = [r for r in evals if r["step"] >= len(records) - quarter]
    discrepancy = [r["discrepancy"] for r in records if "discrepancy" in r]
    rewards = [r["reward"] for r in records]

    def mean_of(key: str, rows: list[dict[str, Any]] = records) -> float | None:
        return _mean([r[key] for r in rows if r.get(key) is not None])

    layer_keys = sorted(k for k in records[0] if k.startswith(LAYER_FLIPS))
    return {
        "label": spec.label, "method": spec.method, "quant": spec.quant, "replay": spec.replay,
        "seed": settings.seed, "settings": asdict(settings),
        "initial_acc_engine": evals[0]["eval_acc_engine"],
        "final_acc_engine": evals[-1]["eval_acc_engine"], "best_acc_engine": max(r["eval_acc_engine"] for r in evals),
        "late_acc_engine": mean_of("eval_acc_engine", late_evals),
        "acc_change_engine": mean_of("eval_acc_engine", late_evals) - evals[0]["eval_acc_engine"],
        "final_acc_fp32": evals[-1]["eval_acc_fp32"], "best_acc_fp32": max(r["eval_acc_fp32"] for r in evals),
        "late_acc_fp32": mean_of("eval_acc_fp32", late_evals),
        "final_reward": _mean(rewards[-settings.collapse_window:]),
        "late_reward": _mean(rewards[-quarter:]),
        "discrepancy_mean": _mean(discrepancy) or 0.0,
        "discrepancy_max": max(discrepancy, default=0.0),
        "discrepancy_first": _mean(discrepancy[:quarter]) or 0.0,
        "discrepancy_last": _mean(discrepancy[-quarter:]) or 0.0,
        "routing_flip_fraction": mean_of("routing_flip_fraction"),
        **{key: mean_of(key) for key in layer_keys},
        "discrepancy_flipped": mean_of("discrepancy_flipped"),
        "discrepancy_unflipped": mean_of("discrepancy_unflipped"),
        "collapse_step": min((step for step in (collapse_step(rewards, settings.collapse_window),
                                                blow_up_step(records)) if step is not None), default=None),
        "engine_nonfinite_fraction": mean_of("engine_nonfinite_fraction") or 0.0,
        "seconds": records[-1]["seconds"],
        "seconds_per_step": records[-1]["seconds"] / len(records),
    }
