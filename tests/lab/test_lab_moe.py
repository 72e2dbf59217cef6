"""The mixture-of-experts policy: routing against a per-token reference, replay, the KV cache, the engine's recorded
routing, the quantised experts and the routing metrics."""

import pytest
import torch
import torch.nn.functional as F

from mismatch_ctrl.lab.model.engine import RolloutEngine
from mismatch_ctrl.lab.model.floor import c_bar, measure_floor
from mismatch_ctrl.lab.model.policy import MoE, PolicyConfig, TinyPolicy, load_balance_loss
from mismatch_ctrl.lab.model.quant import (
    QuantExperts,
    QuantLinear,
    fake_quantize_weight,
    quantize_activations,
    quantize_model,
)
from mismatch_ctrl.lab.model.routing import routing_metrics
from mismatch_ctrl.lab.model.task import AdditionTask

TASK = AdditionTask(max_digits=2)  # prompt length 7, answers up to 4 tokens
CONFIG = PolicyConfig(vocab_size=15, max_len=19, d_model=32, n_layers=2, n_heads=4, d_ff=16, n_experts=6, top_k=2)


def peaked_moe(seed: int = 0, std: float = 0.25) -> TinyPolicy:
    """A small MoE policy with large random weights: peaked next-token distributions and decisive routers."""
    policy = TinyPolicy(CONFIG, seed=seed)
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if name.endswith("weight") and param.dim() >= 2:
                param.normal_(0.0, std, generator=generator)
    return policy


def prompts(n: int, seed: int = 0) -> torch.Tensor:
    return TASK.make_prompts(n, torch.Generator().manual_seed(seed))


def reference_moe(layer: MoE, x: torch.Tensor, replay: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
    """Token by token: top-k of the router logits (or the replayed set), softmax over the chosen logits, weighted sum
    of the chosen experts' GELU MLPs."""
    e = layer.experts
    rows, sets = [], []
    for i, token in enumerate(x.reshape(-1, x.shape[-1])):
        logits = layer.gate.weight @ token
        chosen = sorted(logits.topk(layer.top_k).indices.tolist()) if replay is None else \
            replay.reshape(-1, layer.top_k)[i].tolist()
        weights = torch.softmax(logits[chosen], dim=0)
        out = torch.zeros_like(token)
        for w, k in zip(weights, chosen):
            hidden = F.gelu(e.fc1_weight[k] @ token + e.fc1_bias[k])
            out = out + w * (e.fc2_weight[k] @ hidden + e.fc2_bias[k])
        rows.append(out)
        sets.append(chosen)
    return torch.stack(rows).reshape(x.shape), sets


def test_moe_layer_matches_a_per_token_reference_with_and_without_replay():
    layer = peaked_moe().blocks[0].moe
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, chosen, logits = layer(x)
        expected, sets = reference_moe(layer, x)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        assert chosen.reshape(-1, 2).tolist() == sets
        torch.testing.assert_close(logits, x @ layer.gate.weight.T)
        replay = torch.randint(0, 6, (3, 5, 1), generator=torch.Generator().manual_seed(2))
        replay = torch.cat([replay, (replay + 1 + torch.randint(0, 5, (3, 5, 1))) % 6], dim=-1).sort(-1).values
        out, chosen, _ = layer(x, replay)
        torch.testing.assert_close(out, reference_moe(layer, x, replay)[0], atol=1e-5, rtol=1e-5)
        assert torch.equal(chosen, replay)
    with pytest.raises(ValueError, match="replay"):
        layer(x, replay[..., :1])


def test_replay_keeps_router_gradients_and_unchosen_experts_get_none():
    layer = peaked_moe().blocks[0].moe
    x = torch.randn(4, 3, 32, generator=torch.Generator().manual_seed(3))
    replay = torch.tensor([0, 1]).expand(4, 3, 2)
    out, _, _ = layer(x, replay)
    out.square().sum().backward()
    assert layer.gate.weight.grad[:2].abs().sum() > 0
    assert layer.experts.fc1_weight.grad[:2].abs().sum() > 0
    assert layer.experts.fc1_weight.grad[2:].abs().sum() == 0


def test_moe_kv_cached_generation_matches_the_full_forward():
    policy = peaked_moe()
    tokens = torch.randint(0, 15, (5, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = policy.run(tokens)
        cache = policy.new_cache(5, 12)
        parts = [policy.run(tokens[:, :4], cache), policy.run(tokens[:, 4:7], cache)]
        parts += [policy.run(tokens[:, t: t + 1], cache) for t in range(7, 12)]
    torch.testing.assert_close(torch.cat([p.hidden for p in parts], dim=1), full.hidden, atol=1e-5, rtol=1e-5)
    assert torch.equal(torch.cat([p.routing for p in parts], dim=1), full.routing)
    assert full.routing.shape == (5, 12, 2, 2)


def test_engine_records_routing_of_every_fed_position_and_r3_reproduces_its_log_probs():
    policy = peaked_moe(std=0.15)
    engine = RolloutEngine(policy, "none")
    rollout = engine.generate(prompts(16), 4, generator=torch.Generator().manual_seed(0))
    mask = rollout.response_mask
    assert rollout.routing.shape == (64, rollout.tokens.shape[1] - 1, 2, 2)
    assert (rollout.routing[:, :, :, 0] < rollout.routing[:, :, :, 1]).all()
    forced, forced_routing = engine.score(rollout.tokens, rollout.prompt_len, mask)
    ends = rollout.prompt_len - 1 + rollout.response_lengths  # positions fed before each response's last token
    fed = torch.arange(rollout.tokens.shape[1] - 1) < ends[:, None]
    assert torch.equal(forced_routing[fed], rollout.routing[fed])
    own = policy.score(rollout.tokens, rollout.prompt_len, mask)
    replayed = policy.score(rollout.tokens, rollout.prompt_len, mask, replay=rollout.routing)
    assert torch.equal(replayed.log_probs, forced)  # the trainer with R3 is the engine's teacher-forced forward
    assert torch.equal(replayed.routing, rollout.routing)
    assert torch.equal(own.log_probs, forced)
    assert (replayed.log_probs - rollout.rollout_log_probs)[mask].abs().max() < 1e-5


@pytest.mark.parametrize("mode", ["e4m3", "e5m2"])
def test_quantised_engine_flips_routes_and_r3_removes_the_flips(mode):
    policy = peaked_moe(std=0.15)
    rollout = RolloutEngine(policy, mode).generate(prompts(32), 8, generator=torch.Generator().manual_seed(0))
    mask = rollout.response_mask
    own = policy.score(rollout.tokens, rollout.prompt_len, mask)
    diff = (own.log_probs.exp() - rollout.rollout_log_probs.exp()).abs().detach()
    flips = routing_metrics(own.routing, rollout.routing, rollout.prompt_len, mask, diff)
    assert 0.005 < flips["routing_flip_fraction"] < 0.5
    assert flips["discrepancy_flipped"] > flips["discrepancy_unflipped"]
    replayed = policy.score(rollout.tokens, rollout.prompt_len, mask, replay=rollout.routing)
    none = routing_metrics(replayed.routing, rollout.routing, rollout.prompt_len, mask, diff)
    assert none["routing_flip_fraction"] == 0 and none["discrepancy_flipped"] is None


def test_routing_metrics_against_a_per_token_loop():
    generator = torch.Generator().manual_seed(4)
    n, prompt_len, r, layers = 6, 4, 5, 3
    engine = torch.randint(0, 4, (n, prompt_len + r - 1, layers, 2), generator=generator)
    trainer = torch.where(torch.rand(engine.shape[:3] + (1,), generator=generator) < 0.2, engine.flip(-1), engine)
    trainer = torch.where(torch.rand(engine.shape[:3] + (1,), generator=generator) < 0.1, 9, trainer)
    mask = torch.arange(r) < torch.tensor([5, 3, 1, 0, 4, 2])[:, None]
    diff = torch.rand(n, r, generator=generator)
    got = routing_metrics(trainer.sort(-1).values, engine.sort(-1).values, prompt_len, mask, diff)
    flipped, layer_flips, kept = [], [0] * layers, []
    for i in range(n):
        for t in range(r):
            if not mask[i, t]:
                continue
            position = prompt_len - 1 + t
            per_layer = [set(trainer[i, position, j].tolist()) != set(engine[i, position, j].tolist())
                         for j in range(layers)]
            layer_flips = [a + b for a, b in zip(layer_flips, per_layer)]
            (flipped if any(per_layer) else kept).append(float(diff[i, t]))
    tokens = len(flipped) + len(kept)
    assert got["routing_flip_fraction"] == pytest.approx(len(flipped) / tokens)
    for j in range(layers):
        assert got[f"routing_flip_fraction_layer{j}"] == pytest.approx(layer_flips[j] / tokens)
    assert got["discrepancy_flipped"] == pytest.approx(sum(flipped) / len(flipped))
    assert got["discrepancy_unflipped"] == pytest.approx(sum(kept) / len(kept))
    prompt_flips = [any(set(trainer[i, p, j].tolist()) != set(engine[i, p, j].tolist()) for j in range(layers))
                    for i in range(n) for p in range(prompt_len - 1)]
    assert got["routing_flip_fraction_prompt"] == pytest.approx(sum(prompt_flips) / len(prompt_flips))


def test_load_balance_loss_is_one_when_uniform_and_matches_the_formula():
    logits = torch.zeros(2, 4, 1, 4)
    routing = torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]]).reshape(1, 4, 1, 2).expand(2, 4, 1, 2)
    assert load_balance_loss(logits, routing).item() == pytest.approx(1.0)
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 5, 2, 4, generator=generator)
    routing = logits.topk(2, dim=-1).indices.sort(-1).values
    expected = []
    for j in range(2):
        flat = logits[:, :, j].reshape(-1, 4)
        probs = torch.softmax(flat, -1).mean(0)
        counts = torch.bincount(routing[:, :, j].reshape(-1), minlength=4).float()
        expected.append(4 * (counts / counts.sum() * probs).sum())
    assert load_balance_loss(logits, routing).item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-6)


def test_engine_quantises_every_expert_but_never_the_router():
    policy = peaked_moe()
    model = quantize_model(policy, "e4m3")
    for block, source in zip(model.blocks, policy.blocks):
        assert isinstance(block.moe.gate, torch.nn.Linear) and not isinstance(block.moe.gate, QuantLinear)
        assert torch.equal(block.moe.gate.weight, source.moe.gate.weight)
        assert isinstance(block.moe.experts, QuantExperts)
        for k in range(CONFIG.n_experts):
            assert torch.equal(block.moe.experts.fc1_weight[k], fake_quantize_weight(source.moe.experts.fc1_weight[k],
                                                                                     "e4m3"))
    experts, source = model.blocks[0].moe.experts, policy.blocks[0].moe.experts
    x = torch.randn(7, 32, generator=torch.Generator().manual_seed(6))
    weights = torch.softmax(torch.randn(7, CONFIG.n_experts), -1)
    expected = torch.zeros(7, 32)
    for k in range(CONFIG.n_experts):
        w1, w2 = (fake_quantize_weight(getattr(source, f"fc{i}_weight")[k], "e4m3") for i in (1, 2))
        hidden = F.gelu(quantize_activations(x, "e4m3") @ w1.T + source.fc1_bias[k])
        expected += weights[:, k:k + 1] * (quantize_activations(hidden, "e4m3") @ w2.T + source.fc2_bias[k])
    torch.testing.assert_close(experts(x, weights), expected.detach(), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        policy.blocks[0].moe.experts.fc2_weight.mul_(2.0)
    RolloutEngine(policy, "none")  # building another engine leaves this one alone
    engine = RolloutEngine(policy, "e4m3")
    engine.sync(policy)
    assert torch.equal(engine.model.blocks[0].moe.experts.fc2_weight[3],
                       fake_quantize_weight(policy.blocks[0].moe.experts.fc2_weight[3], "e4m3"))


def test_floor_is_zero_for_an_exact_engine_and_c_bar_is_a_mean_of_sequence_means():
    lp_train = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 0.3, 0.1]]))
    lp_roll = torch.log(torch.tensor([[0.4, 0.4, 0.1], [0.25, 0.3, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert c_bar(lp_train, lp_roll, mask) == pytest.approx(((0.1 + 0.0) / 2 + 0.05) / 2)
    floor = measure_floor(peaked_moe(std=0.15), TASK, "none", rollouts=2, prompts=8, samples=4)
    assert floor["floor"] < 1e-6 and floor["floor_r3"] < 1e-6
    assert floor["medians"]["routing_flip_fraction"] == 0
