"""The flags of slime's ``train.py`` the launcher knows by name, and argparse's abbreviation rule on them: what
``--dry-run`` checks the flags after ``--`` with where slime's own parsers (:mod:`.flags`) cannot be imported.

How slime 624b824a reads ``train.py``'s arguments (``slime/utils/arguments.py:1584-1632``): three argparse parsers,
each with ``parse_known_args``. Its pre-parser (``arguments.py:1591``) and Megatron-LM 1dcf0daf's parser with slime's
flags (``megatron/training/arguments.py:89-90``, called with ``ignore_unknown_args=True`` from
``slime/backends/megatron_utils/arguments.py:195``) are built with ``allow_abbrev=False``: a flag that is not one of
their option strings exactly is left over, and dropped without a word. The SGLang parser and its helper
(``slime/backends/sglang_utils/arguments.py:203-226``) keep argparse's default ``allow_abbrev=True``: a unique prefix
of one of their options (``--sglang-*``, ``--router-*``, ``--rollout-num-gpus-per-engine``) is completed to it. So a
word that only begins a flag name is either completed past the launcher's checks (which read full names) or dropped;
a launch refuses both (:mod:`.flags`).

Without slime, :func:`offline_findings` applies that rule to :data:`KNOWN_FLAGS`: a flag after ``--`` that is not a
known name but begins one or more known names is an abbreviation (refused, the full names given); a flag that is no
known name and begins none is not judged (slime's parsers know far more flags than the launcher does), only named
with the closest known spelling when there is one.
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

# The flags the launcher passes to train.py, checked by hand against slime 624b824a (slime/utils/arguments.py, incl.
# reset_arg), Megatron-LM 1dcf0daf (parser built from megatron/training/arguments.py; --fp8-format, --fp8-recipe and
# --transformer-impl are TransformerConfig fields there, --fp16 a ModelParallelConfig field,
# megatron/core/model_parallel_config.py:109) and SGLang 0.5.15.post1 server args passed through as --sglang-<arg>
# (python/sglang/srt/server_args.py: ep_size -> --ep-size, cuda_graph_bs_decode -> --cuda-graph-bs-decode).
PASSED_FLAGS = frozenset("""
--actor-num-nodes --actor-num-gpus-per-node --num-gpus-per-node --colocate
--hf-checkpoint --ref-load --load --save --save-interval
--prompt-data --input-key --label-key --apply-chat-template --rollout-shuffle --custom-rm-path
--num-rollout --rollout-batch-size --n-samples-per-prompt --rollout-max-response-len --rollout-temperature
--global-batch-size --balance-data --eval-config --eval-interval --skip-eval-before-train
--tensor-model-parallel-size --sequence-parallel --pipeline-model-parallel-size --context-parallel-size
--expert-model-parallel-size --expert-tensor-parallel-size
--recompute-granularity --recompute-method --recompute-num-layers --use-dynamic-batch-size --max-tokens-per-gpu
--advantage-estimator --eps-clip --eps-clip-high
--custom-advantage-function-path --custom-tis-function-path --custom-megatron-before-train-step-hook-path
--custom-megatron-init-path --custom-config-path --get-mismatch-metrics --use-rollout-routing-replay
--optimizer --lr --lr-decay-style --weight-decay --adam-beta1 --adam-beta2
--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer
--rollout-num-gpus-per-engine --sglang-ep-size --sglang-mem-fraction-static --sglang-cuda-graph-bs-decode
--attention-dropout --hidden-dropout --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32
--attention-backend --use-wandb --wandb-project --wandb-group --wandb-team --use-tensorboard
--disable-bias-linear --qk-layernorm --group-query-attention --num-attention-heads --num-query-groups --kv-channels
--num-layers --hidden-size --ffn-hidden-size --normalization --position-embedding-type --norm-epsilon
--rotary-percent --swiglu --untie-embeddings-and-output-weights --vocab-size --rotary-base --moe-ffn-hidden-size
--moe-router-score-function --moe-token-dispatcher-type --moe-router-topk --moe-layer-freq --num-experts
--moe-grouped-gemm --moe-token-drop-policy --moe-router-dtype --moe-permute-fusion --moe-aux-loss-coeff
--transformer-impl --fp8-format --fp8-recipe --fp16
--spec --use-gated-attention --apply-layernorm-1p --moe-shared-expert-intermediate-size --attention-output-gate
--moe-shared-expert-gate
""".split())

# Flags the launcher's checks read among the arguments after -- (context_length, precision, values, preflight, main).
READ_FLAGS = frozenset("""
--sglang-context-length --sglang-allow-auto-truncate --eval-max-response-len --rollout-max-prompt-len
--eval-max-prompt-len --n-samples-per-eval-prompt --disable-rewards-normalization --custom-reward-post-process-path
--debug-train-only --debug-rollout-only --load-debug-rollout-data --bf16 --sglang-dtype --sglang-quantization
--sglang-kv-cache-dtype --fp8-param-gather --fp4-format --loss-scale --use-torch-fsdp2 --initial-loss-scale
--min-loss-scale --loss-scale-window --hysteresis --fp16-lm-cross-entropy
""".split())

# Real flags that begin one of the flags above, so that the prefix rule never calls them abbreviations: slime's
# --rollout-num-gpus (slime/utils/arguments.py), SGLang 0.5.15.post1's aliases --ep and --expert-parallel-size of
# --ep-size and the deprecated --cuda-graph-bs of --cuda-graph-bs-decode, as slime prefixes them. Found by comparing
# the flags above with every option string of slime's and Megatron-LM's sources at the pinned commits.
PREFIX_FLAGS = frozenset({"--rollout-num-gpus", "--sglang-ep", "--sglang-expert-parallel-size",
                          "--sglang-cuda-graph-bs"})

KNOWN_FLAGS = PASSED_FLAGS | READ_FLAGS | PREFIX_FLAGS
"""Every full flag name the launcher knows (slime's, Megatron's and SGLang's through slime)."""


def offline_findings(user_flags: Sequence[str]) -> list[dict[str, Any]]:
    """argparse's abbreviation rule on :data:`KNOWN_FLAGS`, in :mod:`.flags`' finding format, for each distinct flag of
    ``user_flags`` that is not a known name: ``abbreviation`` (``full``: the known names it begins), else
    ``not known`` (``like``: the closest known name, if any is close)."""
    out: list[dict[str, Any]] = []
    for flag in dict.fromkeys(user_flags):
        if flag in KNOWN_FLAGS:
            continue
        full = sorted(name for name in KNOWN_FLAGS if name.startswith(flag))
        if full:
            out.append({"kind": "abbreviation", "flag": flag, "full": full})
        else:
            out.append({"kind": "not known", "flag": flag,
                        "like": difflib.get_close_matches(flag, sorted(KNOWN_FLAGS), n=1, cutoff=0.8)})
    return out
