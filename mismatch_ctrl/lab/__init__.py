"""CPU lab: a tiny but real RL problem whose rollouts come from an FP8-quantised copy of an fp32 policy.

Same arrangement as FP8 SGLang rollouts + BF16 Megatron training, so the training-inference mismatch is real:

- ``task``: verifiable tasks (reversed addition, long reversal) with a shared vocabulary and vectorised rewards;
- ``policy``: a tiny decoder-only transformer (fp32), dense or mixture-of-experts (top-k router, routing replay),
  with a KV cache and teacher-forced response log-probs;
- ``quant``: FP8 (e4m3 / e5m2, 128x128 block weight scales, per-token activations) and BF16 simulation; MoE routers
  stay unquantised;
- ``engine``: the rollout engine, a quantised copy of the policy re-quantised at every weight sync, recording its
  expert choices;
- ``warmup``: a cached supervised warm-up per policy kind and seed that gives the policy a non-trivial success rate;
- ``methods`` / ``trainer``: GRPO through ``mismatch_ctrl``'s slime hooks, optionally with routing replay (R3);
- ``routing`` / ``floor``: routing flips and the engine's discrepancy floor with and without replay;
- ``aggregate`` / ``frontier`` / ``plots`` / ``report`` / ``run`` / ``options``: seeds and intervals, the dose-response
  frontier against the exact engine, plots, the report and ``mismatch-ctrl lab``.
"""
