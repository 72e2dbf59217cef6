"""Rollout correction: importance-sampling weights and rejection (ALGORITHMS.md section 3; 003 Geo-MIS/Geo-RS).

All ratios are ``rho = pi_train / mu_rollout``. The log-weight of a token depends on the level:

- ``token``: ``l[t]``
- ``sequence``: ``sum_t m l`` broadcast to the sequence
- ``geometric``: ``sum_t m l / max(sum_t m, 1)`` broadcast (length-normalised: immune to the "length trap")

Two stages, which may be combined (e.g. a Geo-RS filter plus token TIS weights):

- **IS** (``is_*``): ``truncate`` ``w = min(rho, C_hi)`` (TIS); ``clip`` ``w = clamp(rho, C_lo, C_hi)``;
  ``mask`` ``w = rho`` and tokens/sequences with ``rho`` outside ``[C_lo, C_hi]`` are rejected (MIS, IcePop).
- **RS** (``rs_*``): reject tokens/sequences with ``rho`` outside ``[rs_low, rs_high]``; ``rs_k3_max`` rejects a
  sequence whose mean K3 exceeds it; ``veto`` rejects a sequence with any token ``rho < veto``.

``batch_normalize`` divides the weights by the mean IS weight of the data-parallel batch before rejection (token
level: over its trained tokens; sequence levels: over its sequences with trained tokens), as slime's ``mis.py``
(``tis_batch_normalize``) and verl (``rollout_is_batch_normalize``) do, with the same single batch reduction as the
metrics; in slime's TIS hook that batch is one micro-batch slot of every DP rank (see
:mod:`mismatch_ctrl.slime.tis`). Rejected tokens get weight 0 and leave the modified mask; the caller keeps them in
the loss denominator (slime's convention), so an all-rejected batch contributes zero loss.

Everything per sequence (decisions, metrics) and per batch (means, diagnostics, the normalisation) is a function of
the sequence statistics (:mod:`mismatch_ctrl.seqstats`); only the IS weights touch tokens again. Rejections are
attributed per stage (each stage's own rejections; stages may overlap): ``tis_rejected_*`` (an IS mask band),
``rs_rejected_*`` (the RS band and the K3 rejection), ``veto_seq_fraction``; ``rejected_*`` is their union. The
diagnostics of the final weights (``is_ess``, ``chi2_token``, ...) are defined in :class:`CorrectionPlan`.
"""

from .columns import correction_columns
from .plan import NORMALIZE_MIN_MEAN, Correction, CorrectionPlan, apply_correction
from .spec import LEVELS, MODES, CorrectionSpec, Level, Mode

__all__ = ["LEVELS", "MODES", "NORMALIZE_MIN_MEAN", "Correction", "CorrectionPlan", "CorrectionSpec", "Level", "Mode",
           "apply_correction", "correction_columns"]
