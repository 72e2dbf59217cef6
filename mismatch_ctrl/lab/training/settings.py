"""What defines a lab run apart from its method and engine (``LabSettings``), and the device it trains on."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from ..model.policy import POLICY_KINDS, PolicyConfig, TinyPolicy
from ..model.tasks import TASKS, make_task


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
        for field in fields(self):  # every integer setting, from its annotation (a run.json may hold "0" or 4.0)
            value = getattr(self, field.name)
            if field.type in ("int", "int | None") and not (value is None and field.type == "int | None") and \
                    (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{field.name} must be an integer, got {value!r}")
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
one on the CPU: CUDA must be at least :data:`AUTO_CUDA_MARGIN` times as fast to be worth leaving the CPU, whose
results are the README's figures and whose throughput grows with its cores while a GPU is shared by the runs.
Measured on one H200 with 16 cores (``make gpu-check`` steps, 2026-11-27, after the hooks' host-sync work): the
105,664-parameter ``moe`` policy ran 1.35x as fast on CUDA alone (6.3 against 4.7 rollouts/s) and 1.22x at the
demo's load, its six runs at once (31.3 against 25.7 rollouts/s in all: each run's rate fell from 6.3 to 5.2 on the
shared GPU, from 4.7 to 4.3 on the CPU); the 5.3M-parameter ``moe-large`` 16x (4.9 against 0.31, one run). Before
that work the small policy was slower on CUDA (20 rollouts with the warm-up: 17.2 s against 13.8 s)."""
AUTO_CUDA_MARGIN = 1.5
"""How many times as fast as the CPU CUDA must be for ``--device auto`` to choose it (``make gpu-check`` judges
:data:`CUDA_MIN_PARAMETERS` by it)."""


def auto_device(policy: str, task: str) -> str:
    """What ``--device auto`` runs ``policy`` on (see :data:`CUDA_MIN_PARAMETERS`)."""
    if not torch.cuda.is_available():
        return "cpu"
    size = TinyPolicy(PolicyConfig.of_kind(policy, make_task(task))).num_parameters()
    return "cuda" if size >= CUDA_MIN_PARAMETERS else "cpu"
