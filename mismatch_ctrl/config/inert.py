"""Settings that would leave a controller or a guard inert: one rule for ``mismatch-ctrl check-config``, the
launchers' ``--dry-run`` and slime's ``on_megatron_init``."""

from __future__ import annotations

from ..batch import LOG_RATIO_BOUND
from ..dcgrpo import EPS_MAX
from ..signals import SIGNAL_MAX
from .schema import ROOT_KEY, Config

EPS_AUTO_FACTOR_WARN = 10.0
"""An ``eps_auto_factor`` above this sets a budget a working stack's ``C_bar`` rarely reaches (floors of FP8 MoE
rollouts span about 1e-3 to 2e-2): DC-GRPO would rarely act [ours]."""
LOWEST_FP8_FLOOR = 1.0e-3
"""The low end of the discrepancy floors of quantised rollout engines (FP8 MoE stacks: 1e-3 to 2e-2; the lab's e4m3
engine ~1.2e-2): an ``eps_auto_factor`` of ``EPS_MAX / LOWEST_FP8_FLOOR`` or more makes any such engine's calibrated
eps no budget at all [ours]."""
MOST_ROLLOUTS = 10**6
"""More rollouts than a run has (the launchers' bound of NUM_ROLLOUT): a dual update that needs more to move lambda
across ``[0, lambda_max]`` never acts [ours]."""
FLOAT32_RESOLUTION = 2.0**-24
"""Half of float32's spacing at 1: a change smaller than this leaves an advantage of magnitude 1 (GRPO's normalised
advantages are of that order) unchanged, and ``1 + c`` equal to 1."""


def _unrepresentable(config: Config) -> tuple[list[str], list[str]]:
    """``(errors, warnings)`` for controllers whose every action is lost to float32 rounding or to the budget's
    bound, at any discrepancy an engine can produce: eps calibrated beyond ``EPS_MAX`` on any quantised engine, a
    DC-GRPO penalty or cap below float32's resolution of an advantage of 1, an ACRL band ``[1 / (1 + c), 1 + c]``
    that is ``[1, 1]`` in float32."""
    errors, warnings = [], []
    d, a = config.dcgrpo, config.acrl
    factor_used = d.penalty_form != "fixed" and (d.eps == "auto" or d.eps_guard == "clamp" or d.drift_guard != "off")
    if d.enabled and factor_used and d.eps_auto_factor * LOWEST_FP8_FLOOR >= EPS_MAX:
        errors.append(f"{ROOT_KEY}.dcgrpo.eps_auto_factor = {d.eps_auto_factor:g}: eps is set to that many times the "
                      "measured floor (eps: auto, the floor guard, the drift guard), and a quantised engine's floor "
                      f"is at least about {LOWEST_FP8_FLOOR:g}, so eps would be {EPS_MAX:g} or more, which no "
                      "discrepancy a working engine produces reaches: DC-GRPO would never act (the default is 1.1)")
    largest = max(d.lambda_max or 0.0, d.lambda_0 or 0.0) * SIGNAL_MAX[d.signal]
    if d.enabled and d.lambda_max is not None and largest < FLOAT32_RESOLUTION:
        warnings.append(f"{ROOT_KEY}.dcgrpo.lambda_max = {d.lambda_max:g}: the penalty lambda c never exceeds "
                        f"{largest:.3g} (signal {d.signal}: c <= {SIGNAL_MAX[d.signal]:.4g}), below float32's "
                        f"resolution of an advantage of 1 ({FLOAT32_RESOLUTION:.3g}): DC-GRPO would change no "
                        "advantage of GRPO's usual size; raise lambda_max")
    if d.enabled and d.penalty_form != "fixed" and d.eta is not None and d.lambda_max is not None:
        needed = d.lambda_max / (d.eta * SIGNAL_MAX[d.signal])
        if needed > MOST_ROLLOUTS:
            warnings.append(f"{ROOT_KEY}.dcgrpo.eta = {d.eta:g}: lambda += eta (C_bar - eps) moves lambda by at most "
                            f"eta x {SIGNAL_MAX[d.signal]:.4g} per rollout (signal {d.signal}), so reaching lambda_max "
                            f"= {d.lambda_max:g} takes over {needed:.3g} rollouts, more than any run has: the dual "
                            "update would never act (lambda stays at lambda_0); raise eta (default 1.0), or say "
                            "penalty_form: fixed")
    if d.enabled and d.cap is not None and d.cap < FLOAT32_RESOLUTION:
        warnings.append(f"{ROOT_KEY}.dcgrpo.penalty_cap = {d.cap:g}: the penalty is capped at {d.cap:g} x mean|A|, "
                        f"below float32's resolution of an advantage ({FLOAT32_RESOLUTION:.3g} relative): DC-GRPO "
                        "would change no advantage; raise penalty_cap or set none")
    if a.enabled and a.c_max < FLOAT32_RESOLUTION:
        errors.append(f"{ROOT_KEY}.acrl.c_max = {a.c_max:g}: 1 + c is 1 in float32, so the band [1 / (1 + c), 1 + c] "
                      "clips every IS weight to 1 and ACRL corrects nothing; raise c_max (default 4.0)")
    return errors, warnings


def inert_settings(config: Config, num_rollout: int | None = None) -> tuple[list[str], list[str]]:
    """``(errors, warnings)``: settings that would leave a controller or a guard inert, over a run of ``num_rollout``
    rollouts when given. An error is a controller that would never act (DC-GRPO calibrating ``eps: auto`` for the
    whole run or fixed at ``lambda_0 = 0``, ACRL measuring its reference for the whole run, with a band fixed at
    ``c_min = c_max`` or a reference no ``D`` can exceed, and :func:`_unrepresentable`'s); a warning a guard or
    schedule that could not or would
    rarely act (the infeasible-budget guard's floor window, the drift guard's streak or, under ``penalty_form:
    fixed``, any drift guard, the LR decay's period or the surge detector's windows, an ``eps_auto_factor`` far above
    the floor). One rule for ``mismatch-ctrl check-config``, the launchers' ``--dry-run`` and slime's
    ``on_megatron_init``, so the first two refuse what the third would, before a cluster starts. (Values that are
    never valid, an ``eps_auto_factor`` at or below 1 among them, are refused when the config is read.)"""
    errors, warnings = _unrepresentable(config)
    d, a, decay = config.dcgrpo, config.acrl, config.lr_decay
    fixed, auto = d.penalty_form == "fixed", d.eps == "auto"
    factor_used = not fixed and (auto or d.eps_guard == "clamp" or d.drift_guard != "off")
    if d.enabled and factor_used and EPS_AUTO_FACTOR_WARN < d.eps_auto_factor < EPS_MAX / LOWEST_FP8_FLOOR:
        warnings.append(f"{ROOT_KEY}.dcgrpo.eps_auto_factor = {d.eps_auto_factor:g}: eps is set to that many times the "
                        f"measured floor (eps: auto, the floor guard, the drift guard); above {EPS_AUTO_FACTOR_WARN:g} "
                        "C_bar rarely reaches the budget and DC-GRPO rarely acts (the default is 1.1)")
    if d.enabled and fixed and d.lambda_0 == 0:
        errors.append(f"{ROOT_KEY}.dcgrpo.lambda_0 = 0 with penalty_form: fixed: the penalty is lambda_0 c and lambda "
                      "never moves, so DC-GRPO would never shape an advantage; give lambda_0 a value > 0 or another "
                      "penalty_form")
    if d.enabled and fixed and d.drift_guard != "off":
        warnings.append(f"{ROOT_KEY}.dcgrpo.drift_guard = {d.drift_guard} with penalty_form: fixed: there is no dual "
                        "update, so the drift guard never acts (drift_guard: off to say so)")
    if a.enabled and a.c_min == a.c_max:
        errors.append(f"{ROOT_KEY}.acrl.c_min = c_max = {a.c_max:g}: the band [1 / (1 + c), 1 + c] is fixed and ACRL "
                      "would never move it; widen [c_min, c_max] or use a token IS preset (correction.preset: "
                      "token_tis) for a fixed clip")
    if a.enabled and a.reference is not None and a.band_high * a.reference >= LOG_RATIO_BOUND:
        errors.append(f"{ROOT_KEY}.acrl.reference = {a.reference:g}: D, the median per-sequence mean |log-ratio|, "
                      f"never exceeds {LOG_RATIO_BOUND:g} (log-ratios are clamped there), so it never rises above "
                      f"band_high x reference = {a.band_high * a.reference:g} and ACRL could only widen its band; give "
                      "a D measured in a run (rollout/mismatch_ctrl/acrl_discrepancy) or null to calibrate it")
    if num_rollout is None:
        return errors, warnings
    run = f"--num-rollout is {num_rollout}"
    if d.enabled and auto and d.calibration_rollouts >= num_rollout:
        errors.append(f"{ROOT_KEY}.dcgrpo.calibration_rollouts = {d.calibration_rollouts} with eps: auto, but "
                      f"{run}: DC-GRPO would calibrate for the whole run and never shape an advantage; lower "
                      "calibration_rollouts or give eps a number")
    elif d.enabled and not fixed:
        if not auto and d.eps_guard == "clamp" and d.floor_rollouts >= num_rollout:
            warnings.append(f"{ROOT_KEY}.dcgrpo.floor_rollouts = {d.floor_rollouts} but {run}: the infeasible-budget "
                            "guard would never measure the floor it checks eps against")
        start = d.calibration_rollouts if auto else 0
        if d.drift_guard != "off" and start < num_rollout <= start + d.drift_window:
            warnings.append(f"{ROOT_KEY}.dcgrpo.drift_window = {d.drift_window} but {run}"
                            f"{f' and eps: auto calibrates for {start}' if auto else ''}: the drift guard could never "
                            "complete a streak (lower drift_window, or drift_guard: off to say so)")
    if a.enabled and a.reference is None and a.calibration_rollouts >= num_rollout:
        errors.append(f"{ROOT_KEY}.acrl.calibration_rollouts = {a.calibration_rollouts} without a reference, but "
                      f"{run}: ACRL would measure its reference for the whole run and never move its band; lower "
                      "calibration_rollouts or give acrl.reference")
    if decay.enabled and isinstance(decay.period, int) and decay.period >= num_rollout:
        warnings.append(f"{ROOT_KEY}.lr_decay.period = {decay.period} but {run}: the learning rate never halves in "
                        "this run")
    elif decay.enabled and decay.period == "auto" and decay.surge.first_trigger() >= num_rollout:
        warnings.append(f"{ROOT_KEY}.lr_decay.surge: the detector needs {decay.surge.first_trigger() + 1} rollouts "
                        f"(baseline_window + gap + consecutive, or warmup + consecutive) before it can trigger, but "
                        f"{run}: with period: auto the learning rate never halves in this run (shorten the surge "
                        "windows or give period a number)")
    return errors, warnings
