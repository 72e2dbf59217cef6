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

The trainer computes in fp32, or in the precision its dose names (``+train-bf16`` / ``+train-fp16``:
``model.precision``): the recompute of step 3 and the training forwards run there, FP16 with Megatron's dynamic loss
scaling from ``LAB_INITIAL_LOSS_SCALE`` (a step whose gradients overflow is skipped, ``train/skipped_steps``,
``train/loss_scale``); a float16 engine
or trainer logs the share of its values that overflowed (``engine_overflow_fraction``, ``train_overflow_fraction``).

The hooks get slime's ``args`` with ``num_experts`` = the policy's expert count, so DC-GRPO resolves its
per-architecture defaults exactly as on the cluster. With ``dump_details`` each rollout's batch is also written in
slime's ``--dump-details`` format (``<run>/dump/train_data/<rollout>.pt``), which ``mismatch-ctrl analyze`` reads.
"""

from __future__ import annotations

import json
import time
from argparse import Namespace
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ...analyze.dumps import samples_from_rollout_data, write_train_dump
from ...batch import Segments
from ...slime import hooks
from ...slime.names import ADVANTAGE_HOOK, INIT_HOOK, LR_HOOK, TIS_HOOK
from ..model.engine import RolloutEngine
from ..model.policy import POLICY_KINDS, PolicyConfig, TinyPolicy
from ..model.precision import LAB_INITIAL_LOSS_SCALE, DynamicLossScaler, precision_model
from ..model.quant import as_quant_config
from ..model.routing import routing_metrics
from ..model.tasks import make_task
from .length_stats import length_buckets
from .methods import RunSpec, method_section
from .settings import LabSettings, check_device
from .summary import summarize

PREFIX = "mismatch_ctrl/"
RUN_FILE = "run.json"


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
        precision = as_quant_config(spec.quant).train
        self.train_model = precision_model(self.policy, precision)
        self.scaler = DynamicLossScaler(LAB_INITIAL_LOSS_SCALE) if precision == "fp16" else None
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=settings.lr)
        for group in self.optimizer.param_groups:
            group.update(max_lr=settings.lr, min_lr=0.0)
        self.scheduler = ConstantLRScheduler(self.optimizer)
        self.max_new = settings.max_new_tokens or self.task.generation_len
        self.args = slime_args(spec, settings, self.max_new, out_dir / "state", self.policy.config.n_experts)
        self.start_hooks()
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.sampler = (self.generator if self.device.type == "cpu"
                        else torch.Generator(self.device).manual_seed(settings.seed))
        self.eval_prompts = self.task.eval_prompts(settings.eval_prompts).to(self.device)

    def start_hooks(self) -> None:
        """Validate the method against the adapter's arguments (slime: ``on_megatron_init``)."""
        hooks.on_megatron_init(self.args)

    def advantages(self, step: int, data: dict[str, Any]) -> None:
        """The advantage step of rollout ``step`` on ``data`` (slime's advantage hook; it sets
        ``data["advantages"]`` and the ``mismatch_ctrl/*`` metrics)."""
        hooks.advantages(self.args, data)

    def before_optimizer_step(self, step: int, opt_step: int) -> None:
        """slime's before-train-step hook (the LR-decay factor), before every optimizer step."""
        hooks.before_train_step(self.args, step, opt_step, [self.policy], self.optimizer, self.scheduler)

    def correct(self, **kwargs: Any) -> tuple[Tensor, list[Tensor], dict[str, Tensor]]:
        """slime's rollout-correction hook on one micro-batch: ``(pg_loss, masks, metrics)``."""
        return hooks.rollout_correction(self.args, **kwargs)

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

    def rollout_data(self, step: int) -> tuple[dict[str, Any], Any, Tensor, dict[str, Any]]:
        """Sample one rollout and build slime's ``rollout_data`` (DP-local = everything, CP = 1); also the routing
        metrics of a mixture-of-experts policy (the trainer's recompute against the engine's expert sets), the task's
        own metrics of the responses, and where the task asks for them the mismatch by response length
        (``length_stats.length_buckets``)."""
        s = self.settings
        prompts = self.task.make_prompts(s.prompts_per_step, self.generator).to(self.device)
        rollout = self.engine.generate(prompts, s.samples_per_prompt, s.temperature, self.max_new, self.sampler)
        raw = self.task.reward(rollout.prompts.cpu(), rollout.responses.cpu())
        mask = rollout.response_mask
        with torch.inference_mode():
            old, routing, _ = self.train_model.score(rollout.tokens, rollout.prompt_len, mask, s.temperature,
                                                self.replay(rollout))
        routed: dict[str, Any] = {}
        if routing is not None:
            prob_diff = (old.exp() - rollout.rollout_log_probs.exp()).abs()
            routed = routing_metrics(routing, rollout.routing, rollout.prompt_len, mask & prob_diff.isfinite(),
                                     prob_diff)
        routed.update(self.task.rollout_metrics(rollout.responses.cpu()))
        if self.task.length_records:
            routed["length_buckets"] = length_buckets(old, rollout.rollout_log_probs, mask)
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
        skipped = 0
        for opt_step in range(s.optimizer_steps):
            self.before_optimizer_step(step, opt_step)
            self.optimizer.zero_grad(set_to_none=True)
            chunk = order[opt_step * per_step:(opt_step + 1) * per_step]
            for micro in chunk.chunk(s.micro_batches):
                for name, value in self._micro_batch(micro.tolist(), data, rollout).items():
                    train_metrics.setdefault(name, []).append(value)
            train_metrics.setdefault("lr", []).append(self.optimizer.param_groups[0]["lr"])
            if self._overflowed():
                skipped += 1
                continue
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step(s.global_batch_size)
        self.engine.sync(self.policy)
        out = {name: sum(values) / len(values) for name, values in train_metrics.items()}
        if self.scaler is not None:
            out.update(loss_scale=self.scaler.scale, skipped_steps=skipped)
        return out

    def _overflowed(self) -> bool:
        """FP16 training: unscale the gradients and update the loss scale; True (gradients dropped) when they hold an
        infinity or a NaN, a step Megatron skips (slime 624b824a ``model.py:660-686``: no optimizer or LR step).
        Always False without loss scaling."""
        if self.scaler is None:
            return False
        found = self.scaler.unscale(list(self.policy.parameters()))
        self.scaler.update(found)
        if found:
            self.optimizer.zero_grad(set_to_none=True)
        return found

    def precision_metrics(self) -> dict[str, float]:
        """Share of the values rounded to float16 that overflowed to infinity since the last call: in the engine
        (sampling and evaluation) and in the trainer's forwards; empty for runs without float16."""
        out = {}
        for name, counter in (("engine_overflow_fraction", self.engine.overflow),
                              ("train_overflow_fraction", getattr(self.train_model, "overflow", None))):
            if counter is not None:
                values, overflows = counter.take()
                out[name] = overflows / values if values else 0.0
        return out

    def _micro_batch(self, index: list[int], data: dict[str, Any], rollout: Any) -> dict[str, float]:
        s = self.settings

        def pick(key: str) -> list[Any]:
            return [data[key][i] for i in index]

        lengths = pick("response_lengths")
        segments = Segments(lengths, self.device)
        mask = rollout.response_mask[index]
        new = self.train_model.score(rollout.tokens[index], rollout.prompt_len, mask, s.temperature,
                                self.replay(rollout, index)).log_probs[mask]
        old = torch.cat(pick("log_probs"))
        advantages = torch.cat(pick("advantages"))
        pg_loss = policy_loss(old - new, advantages, s.eps_clip, s.eps_clip_high)
        loss_masks = pick("loss_masks")
        pg_loss, masks, metrics = self.correct(
            pg_loss=pg_loss, train_log_probs=pick("log_probs"), rollout_log_probs=pick("rollout_log_probs"),
            loss_masks=loss_masks, total_lengths=pick("total_lengths"), response_lengths=lengths)
        kept = torch.cat(masks).float()
        denominators = segments.sum(torch.cat(loss_masks).float())[:, 0].clamp_min(1.0)
        loss = (segments.sum(pg_loss * kept)[:, 0] / denominators).sum() / s.global_batch_size
        (loss if self.scaler is None else loss * self.scaler.scale).backward()
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
                self.advantages(step, data)
                if s.dump_details:
                    write_train_dump(self.out_dir / "dump", step, *samples_from_rollout_data(data))
                record.update(reward=float(raw.mean()), response_length=float(rollout.response_lengths.float().mean()),
                              truncated_fraction=float(rollout.truncated.float().mean()),
                              engine_nonfinite_fraction=float(rollout.nonfinite.float().mean()), **routed)
                record.update({k[len(PREFIX):]: v[0] for k, v in data.items() if k.startswith(PREFIX)})
                record.update({f"train/{k}": v for k, v in self.train_rollout(step, data, rollout).items()})
                if step == s.steps - 1:
                    record.update({f"final_{k}": v for k, v in self.evaluate().items()})
                record.update(self.precision_metrics())
                record["seconds"] = time.perf_counter() - start
                records.append(record)
                log.write(json.dumps(record) + "\n")
                log.flush()
                if progress is not None:
                    progress(1)
        return summarize(self.spec, s, records)
