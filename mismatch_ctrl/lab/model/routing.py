"""Routing mismatch of a mixture-of-experts policy: where the trainer's expert sets differ from the engine's.

A response token's routing is that of the position whose output distribution gives its log-prob (the input position
``prompt_len - 1 + t`` for response token t), so a flip and the token's discrepancy refer to the same forward. The
sets are compared as sets (both sides store them in ascending order).
"""

from __future__ import annotations

from torch import Tensor


def flipped_layers(trainer: Tensor, engine: Tensor) -> Tensor:
    """BoolTensor [..., layers]: the top-k expert set differs, from routings [..., layers, top_k] (ascending)."""
    if trainer.shape != engine.shape:
        raise ValueError(f"routing shapes differ: trainer {tuple(trainer.shape)}, engine {tuple(engine.shape)}")
    return (trainer != engine).any(dim=-1)


def routing_metrics(trainer: Tensor, engine: Tensor, prompt_len: int, response_mask: Tensor,
                    prob_diff: Tensor) -> dict[str, float | None]:
    """Per-rollout routing metrics from the routings of the input positions ([N, P + R - 1, layers, top_k]), the
    response mask [N, R] and the token discrepancy ``|p_train - p_rollout|`` [N, R]:

    - ``routing_flip_fraction``: share of response tokens whose expert set differs in at least one layer;
    - ``routing_flip_fraction_layer{j}``: the same for layer j alone;
    - ``routing_flip_fraction_prompt``: share of prompt positions (before the last) that differ in some layer;
    - ``discrepancy_flipped`` / ``discrepancy_unflipped``: token mean of ``prob_diff`` over the response tokens with /
      without a flip (None when there is no such token).
    """
    flips = flipped_layers(trainer, engine)
    response = flips[:, prompt_len - 1:]
    mask = response_mask.bool()
    if response.shape[:2] != mask.shape or prob_diff.shape != mask.shape:
        raise ValueError(f"response_mask {tuple(mask.shape)} and prob_diff {tuple(prob_diff.shape)} must match the "
                         f"response positions of the routing {tuple(response.shape[:2])}")
    tokens = mask.sum().clamp_min(1)
    token_flipped = response.any(dim=-1)
    out: dict[str, float | None] = {"routing_flip_fraction": float((token_flipped & mask).sum() / tokens)}
    per_layer = (response & mask[..., None]).sum(dim=(0, 1)) / tokens
    out.update({f"routing_flip_fraction_layer{layer}": float(v) for layer, v in enumerate(per_layer)})
    prompt = flips[:, : prompt_len - 1].any(dim=-1)
    out["routing_flip_fraction_prompt"] = float(prompt.float().mean()) if prompt.numel() else 0.0
    for name, selected in (("discrepancy_flipped", token_flipped & mask), ("discrepancy_unflipped",
                                                                          ~token_flipped & mask)):
        count = int(selected.sum())
        out[name] = float(prob_diff[selected].sum() / count) if count else None
    return out
