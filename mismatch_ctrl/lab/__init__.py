"""CPU lab: a tiny but real RL problem whose rollouts come from an FP8-quantised copy of an fp32 policy.

Same arrangement as FP8 SGLang rollouts + BF16 Megatron training, so the training-inference mismatch is real:

- ``task``: verifiable tasks (reversed addition, long reversal) with a shared vocabulary and vectorised rewards;
- ``policy``: a tiny decoder-only transformer (fp32) with a KV cache and teacher-forced response log-probs;
- ``quant``: FP8 (e4m3 / e5m2, 128x128 block weight scales, per-token activations) and BF16 simulation;
- ``engine``: the rollout engine, a quantised copy of the policy re-quantised at every weight sync;
- ``warmup``: a cached supervised warm-up that gives the policy a non-trivial starting success rate.
"""
