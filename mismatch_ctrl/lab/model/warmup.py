"""Supervised warm-up: teach the tiny policy its task from partly corrupted labels, so it starts RL imperfect.

Cross-entropy on the answer tokens (EOS included) given the prompt, AdamW, on the task's ``demonstrations`` (its
answers; ``digitsum`` mixes two forms and weighs some tokens); in a fraction ``corrupt_frac`` of each batch's examples
one answer digit is replaced by a different random digit. After ``steps`` the sampling accuracy (fp32, temperature 1,
``eval_samples`` samples of each of ``eval_prompts`` held-out prompts; a task's ``skill_prefix`` forced at the start
of each response) is measured; while it is below ``min_sample_accuracy`` training continues in chunks of
``extra_steps`` up to ``max_steps`` (the rise is steep, so small chunks keep the result near the threshold). A
mixture-of-experts policy also gets the Switch-Transformer load-balancing loss (``balance_coef`` x
``policy.load_balance_loss``, 1.0 at uniform load) so that no expert is left idle; RL then trains without it. The
result is cached on disk, keyed by a hash of the config (policy kind and seed included); bump ``CACHE_FORMAT`` when a
code change alters what a config produces.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ... import regular_files
from .engine import RolloutEngine
from .policy import POLICY_KINDS, PolicyConfig, TinyPolicy, load_balance_loss
from .task import DIGIT0, EOS, PAD, Task
from .tasks import make_task

SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "d_ff")
CACHE_ENV = "MISMATCH_CTRL_CACHE"
CACHE_FORMAT = 3


@dataclass(frozen=True)
class WarmupConfig:
    """Everything that determines the warmed-up policy (the cache key hashes all of it)."""

    task: str = "add"
    task_options: dict[str, object] = field(default_factory=dict)
    policy: str = "moe"
    d_model: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    d_ff: int | None = None
    balance_coef: float = 0.01
    steps: int = 175
    batch_size: int = 128
    lr: float = 3e-3
    corrupt_frac: float = 0.3
    min_sample_accuracy: float = 0.2
    extra_steps: int = 10
    max_steps: int = 500
    eval_prompts: int = 256
    eval_samples: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "extra_steps", "eval_prompts", "eval_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"WarmupConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps < self.steps:
            raise ValueError(f"WarmupConfig.max_steps ({self.max_steps}) must be >= steps ({self.steps})")
        if not 0.0 <= self.corrupt_frac <= 1.0:
            raise ValueError(f"WarmupConfig.corrupt_frac must be in [0, 1], got {self.corrupt_frac}")
        if self.lr <= 0:
            raise ValueError(f"WarmupConfig.lr must be > 0, got {self.lr}")
        if self.policy not in POLICY_KINDS:
            raise ValueError(f"WarmupConfig.policy: unknown kind {self.policy!r}; choose one of {sorted(POLICY_KINDS)}")
        if self.balance_coef < 0:
            raise ValueError(f"WarmupConfig.balance_coef must be >= 0, got {self.balance_coef}")

    def make_task(self) -> Task:
        return make_task(self.task, **self.task_options)

    def policy_config(self, task: Task) -> PolicyConfig:
        """The policy's shape: the kind's (``POLICY_KINDS``), each of ``d_model``, ``n_layers``, ``n_heads`` and
        ``d_ff`` overriding it when set."""
        shape = {name: getattr(self, name) for name in SHAPE_FIELDS if getattr(self, name) is not None}
        return PolicyConfig.of_kind(self.policy, task, **shape)

    def key(self) -> str:
        """sha256 of the config (the shape fields resolved to the policy's; and the cache format), hex."""
        config = self.policy_config(self.make_task())
        resolved = {name: getattr(config, name) for name in SHAPE_FIELDS if name != "d_ff"}
        text = json.dumps({"format": CACHE_FORMAT, **asdict(self), **resolved}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


WARMUP_PRESETS: dict[str, WarmupConfig] = {
    "add": WarmupConfig(),
    "reverse": WarmupConfig(task="reverse", steps=390, batch_size=64, max_steps=800, eval_prompts=128),
    "reverse-long": WarmupConfig(task="reverse-long", steps=300, batch_size=64, max_steps=1500, extra_steps=25,
                                 eval_prompts=64, eval_samples=2, min_sample_accuracy=0.3),
    "digitsum": WarmupConfig(task="digitsum", steps=400, corrupt_frac=0.0, min_sample_accuracy=0.9, extra_steps=25,
                             max_steps=1500),
}
"""Tuned defaults per task (measured with the dense policy; the MoE warm-up in the demo reaches the same range: ``add``
reaches sample accuracy 0.2-0.3 after ~200-230 steps, ~10 s on one thread; ``reverse`` jumps from 0 to ~0.4 exact
between ~400 and ~425 steps, ~1.5 min). ``digitsum``: uncorrupted demonstrations (half of them scratchpads, the
opening of a scratchpad weighed down to a 1.5% share), trained until the scratchpad, forced, is right in 90% of the
samples (``Task.skill_prefix``); the scratchpad is learned abruptly, after ~300-800 steps. With a threshold of 0.5,
seeds 70-73 started RL at 0.55-0.99 and their surges began 24 to 71 rollouts in, the least skilled last."""


POLICY_WARMUP: dict[str, dict[str, object]] = {"moe-large": {"lr": 5e-4, "steps": 100}}
"""Per policy kind, what differs from the task's preset. ``moe-large`` (4 layers of width 256, 5.3M parameters): at
the small policies' lr 3e-3 its loss stalls near 1.7 and the warm-up ended at max_steps=500 with sample accuracy
0.01 (an H200, 2026-11-26). At lr 5e-4 the sample accuracy (128 prompts x 2 samples, on the CPU) crossed 0.2 at
125-150 steps with seed 0 and at 200-225 with seed 1 (then 0.5-0.6 by 250-350); at 1e-3 it was 0.02 after 125 steps
(seed 0). So it trains 100 steps, then in chunks of 10 up to the 0.2 target. Every seed of the ``gpu-moe`` preset
(40-47) reached it on the CPU in 130-190 steps (sample accuracy 0.21-0.35, greedy 0.44-0.69; 3-4 min each on one
thread, 2026-11-27; docs/lab-offpolicy.md#at-50x-the-parameters-on-a-gpu)."""


def warmup_preset(task: str, policy: str = "moe", seed: int = 0) -> WarmupConfig:
    """The task's preset for a policy kind and seed (the seed draws the initial weights and the warm-up data), with
    the policy's own settings (:data:`POLICY_WARMUP`)."""
    if task not in WARMUP_PRESETS:
        raise ValueError(f"task: unknown {task!r}; choose one of {sorted(WARMUP_PRESETS)}")
    return dataclasses.replace(WARMUP_PRESETS[task], policy=policy, seed=seed, **POLICY_WARMUP.get(policy, {}))


@dataclass
class WarmupResult:
    """The warmed-up policy, its task, the steps trained, the final fp32 accuracies on the held-out prompts, the
    training time, and whether it came from the cache file ``path`` (None when caching is off)."""

    policy: TinyPolicy
    task: Task
    steps: int
    sample_accuracy: float
    greedy_accuracy: float
    seconds: float
    from_cache: bool
    path: Path | None


def default_cache_dir() -> Path:
    """``$MISMATCH_CTRL_CACHE/lab`` if the variable is set, else ``~/.cache/mismatch_ctrl/lab``."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root) if root else Path.home() / ".cache" / "mismatch_ctrl") / "lab"


def sample_accuracy(
    engine: RolloutEngine, task: Task, prompts: Tensor, n_samples: int = 1, temperature: float = 1.0, seed: int = 0
) -> float:
    """Mean reward of sampled responses (``n_samples`` per prompt), on the prompts' device. A task with a
    ``skill_prefix`` gets it forced at the start of every response (what its warm-up must teach: ``digitsum``'s
    scratchpad)."""
    generator = torch.Generator(prompts.device).manual_seed(seed)
    prefix = torch.tensor(task.skill_prefix, dtype=torch.long, device=prompts.device)
    if not len(prefix):
        rollout = engine.generate(prompts, n_samples, temperature, task.max_response_len, generator)
        return task.reward(rollout.prompts.cpu(), rollout.responses.cpu()).mean().item()
    forced = torch.cat([prompts, prefix.expand(prompts.shape[0], -1)], dim=1)
    rollout = engine.generate(forced, n_samples, temperature, task.max_response_len - len(prefix), generator)
    responses = torch.cat([prefix.expand(rollout.responses.shape[0], -1), rollout.responses], dim=1)
    return task.reward(rollout.prompts[:, :prompts.shape[1]].cpu(), responses.cpu()).mean().item()


def greedy_accuracy(engine: RolloutEngine, task: Task, prompts: Tensor) -> float:
    """Mean reward of greedy responses."""
    rollout = engine.greedy(prompts, task.max_response_len)
    return task.reward(rollout.prompts.cpu(), rollout.responses.cpu()).mean().item()


def corrupt_answers(answers: Tensor, frac: float, generator: torch.Generator) -> Tensor:
    """In a random ``frac`` of the rows, replace one uniformly chosen answer digit by a different random digit."""
    n = answers.shape[0]
    n_digits = ((answers != PAD) & (answers != EOS)).sum(dim=1)
    picked = torch.rand(n, generator=generator) < frac
    position = (torch.rand(n, generator=generator) * n_digits).long().clamp(max=answers.shape[1] - 1)
    shift = torch.randint(1, 10, (n,), generator=generator)
    old = answers.gather(1, position[:, None]).squeeze(1)
    new = DIGIT0 + (old - DIGIT0 + shift) % 10
    rows = torch.nonzero(picked & (n_digits > 0)).squeeze(1)
    corrupted = answers.clone()
    corrupted[rows, position[rows]] = new[rows]
    return corrupted


def _train(
    policy: TinyPolicy,
    task: Task,
    optimizer: torch.optim.Optimizer,
    steps: int,
    config: WarmupConfig,
    generator: torch.Generator,
) -> None:
    device = policy.lm_head.weight.device
    for _ in range(steps):
        prompts = task.make_prompts(config.batch_size, generator)
        labels, weights = task.demonstrations(prompts, generator)
        labels = corrupt_answers(labels, config.corrupt_frac, generator)
        mask = (labels != PAD).to(device)
        scored = policy.score(torch.cat([prompts, labels], dim=1).to(device), task.prompt_len, mask)
        log_probs = scored.log_probs if weights is None else scored.log_probs * weights.to(device)
        loss = -log_probs.sum() / mask.sum()
        if scored.routing is not None and config.balance_coef:
            loss = loss + config.balance_coef * load_balance_loss(scored.router_logits, scored.routing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def _save_atomic(payload: dict[str, object], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MAX_CACHE_BYTES = 1 << 30
"""A cached warm-up is the policy's weights: 21 MB for the 5.3M-parameter ``moe-large``; a larger file is not one."""


def _load(path: Path, task: Task, policy_config: PolicyConfig) -> WarmupResult:
    saved = torch.load(io.BytesIO(regular_files.read_bytes(path, MAX_CACHE_BYTES)), weights_only=True)
    if saved["format"] != CACHE_FORMAT or PolicyConfig(**saved["policy_config"]) != policy_config:
        raise ValueError("format or policy shape differs from the config")
    policy = TinyPolicy(policy_config)
    policy.load_state_dict(saved["state_dict"])
    return WarmupResult(
        policy, task, saved["steps"], saved["sample_accuracy"], saved["greedy_accuracy"], saved["seconds"],
        from_cache=True, path=path,
    )


def cache_path(config: WarmupConfig, cache_dir: str | Path | None = None) -> Path:
    """File of the cached warm-up for ``config``."""
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return directory / f"warmup-{config.task}-{config.policy}-{config.key()[:16]}.pt"


def warmup_policy(
    config: WarmupConfig | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    log: Callable[[str], None] | None = None,
    device: str = "cpu",
) -> WarmupResult:
    """The warmed-up policy for ``config`` (on the CPU): loaded from the cache, or trained on ``device`` (then
    cached atomically).

    cache_dir: default ``default_cache_dir()``; use_cache=False trains and writes nothing.
    """
    config = config or WarmupConfig()
    task = config.make_task()
    policy_config = config.policy_config(task)
    path = cache_path(config, cache_dir) if use_cache else None
    if path is not None and path.exists():
        try:
            return _load(path, task, policy_config)
        except (OSError, RuntimeError, KeyError, ValueError, EOFError, pickle.UnpicklingError) as error:
            if log is not None:
                log(f"warm-up cache {path} unreadable ({error}); training again")
    start = time.perf_counter()
    policy = TinyPolicy(policy_config, seed=config.seed).to(device)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed)
    engine = RolloutEngine(policy, quant="none")
    eval_prompts = task.eval_prompts(config.eval_prompts).to(device)
    steps, chunk = 0, config.steps
    while True:
        _train(policy, task, optimizer, chunk, config, generator)
        steps += chunk
        engine.sync(policy)
        accuracy = sample_accuracy(engine, task, eval_prompts, config.eval_samples, seed=config.seed)
        if log is not None:
            log(f"warm-up step {steps}: sample accuracy {accuracy:.3f}")
        if accuracy >= config.min_sample_accuracy or steps >= config.max_steps:
            break
        chunk = min(config.extra_steps, config.max_steps - steps)
    greedy = greedy_accuracy(engine, task, eval_prompts)
    seconds = time.perf_counter() - start
    policy.cpu()
    if accuracy < config.min_sample_accuracy and log is not None:
        log(f"warm-up stopped at max_steps={config.max_steps} below min_sample_accuracy {config.min_sample_accuracy}")
    if path is not None:
        _save_atomic(
            {
                "format": CACHE_FORMAT,
                "config": json.dumps(asdict(config), sort_keys=True),
                "policy_config": policy_config.to_dict(),
                "state_dict": policy.state_dict(),
                "steps": steps,
                "sample_accuracy": accuracy,
                "greedy_accuracy": greedy,
                "seconds": seconds,
            },
            path,
        )
    return WarmupResult(policy, task, steps, accuracy, greedy, seconds, from_cache=False, path=path)
