"""The launcher's values against what slime does with them: checked before any command is printed.

- **One sample per prompt** trains nothing. slime's rollout manager subtracts each prompt group's mean reward for the
  estimators ``grpo``, ``gspo``, ``cispo`` and ``reinforce_plus_plus_baseline`` (``RolloutManager._post_process_
  rewards``, ``slime/ray/rollout.py:608-633`` at 624b824a; SLIME.md), so with ``N_SAMPLES_PER_PROMPT=1`` every reward
  minus its group's mean is 0 and so is every advantage, DC-GRPO's shaped ones included. Refused unless the flags
  after ``--`` turn that normalisation off (``--disable-rewards-normalization``) or replace it
  (``--custom-reward-post-process-path``).
- **A value that starts with ``-``** after one of the launcher's flags is read by argparse as an option, not as the
  value (``--wandb-project --foo``: "expected one argument", or the next flag swallowed); paths cannot start with
  ``-`` once made absolute (``Settings.made_absolute``), so this is about names (``WANDB_*``, ``RUN_NAME``) and
  addresses.
- **Samples per rollout** (``ROLLOUT_BATCH_SIZE x N_SAMPLES_PER_PROMPT``) at most :data:`MAX_SAMPLES_PER_ROLLOUT`:
  slime's rollout manager holds every sample of a rollout (tokens and log-probs) in one process.
"""

from __future__ import annotations

from typing import Sequence

from .settings import Settings

GROUP_NORMALISED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
"""slime's advantage estimators whose rewards are centred within each prompt's samples (624b824a)."""
NORMALISATION_OFF = ("--disable-rewards-normalization", "--custom-reward-post-process-path")
MAX_SAMPLES_PER_ROLLOUT = 65536
"""8 times DAPO's 512 prompts x 16 samples; the flagship recipe takes 64 x 8."""


def _flag_value(words: Sequence[str], flag: str) -> str | None:
    """The word after the last ``flag`` in ``words`` (argparse keeps the last)."""
    found = None
    for i, word in enumerate(words[:-1]):
        if word == flag:
            found = words[i + 1]
    return found


def group_size_problems(s: Settings, train_arguments: Sequence[str]) -> list[str]:
    """``N_SAMPLES_PER_PROMPT=1`` with a group-normalised estimator (see the module docstring)."""
    estimator = _flag_value(train_arguments, "--advantage-estimator")
    if s["N_SAMPLES_PER_PROMPT"] != "1" or estimator not in GROUP_NORMALISED or \
            any(word.partition("=")[0] in NORMALISATION_OFF for word in train_arguments):
        return []
    return [f"N_SAMPLES_PER_PROMPT=1 with --advantage-estimator {estimator}: slime subtracts each prompt's mean reward "
            "over its samples (RolloutManager._post_process_rewards), so with one sample every advantage is 0 and "
            "the run learns nothing (DC-GRPO and the corrections only reshape or weight those advantages); use 2 or "
            "more samples per prompt (the recipe uses 8)"]


def option_like_problems(s: Settings, command: Sequence[str]) -> list[str]:
    """Settings whose value starts with ``-`` where ``command`` passes it after a flag."""
    out = []
    for name, value in s.values.items():
        if not value.startswith("-"):
            continue
        flags = [command[i - 1] for i, word in enumerate(command) if i and word == value
                 and command[i - 1].startswith("--")]
        if flags:
            out.append(f"{name}={value} starts with '-': the parser of {flags[0]} would read it as an option, not as "
                       f"the value of {flags[0]}; give a value that does not start with '-'")
    return out


def samples_problems(s: Settings) -> list[str]:
    """Samples per rollout above :data:`MAX_SAMPLES_PER_ROLLOUT`."""
    samples = s.int("ROLLOUT_BATCH_SIZE") * s.int("N_SAMPLES_PER_PROMPT")
    if samples <= MAX_SAMPLES_PER_ROLLOUT:
        return []
    return [f"ROLLOUT_BATCH_SIZE x N_SAMPLES_PER_PROMPT = {s['ROLLOUT_BATCH_SIZE']} x {s['N_SAMPLES_PER_PROMPT']} = "
            f"{samples} samples per rollout, above {MAX_SAMPLES_PER_ROLLOUT}: slime's rollout manager holds every "
            "sample of a rollout at once; train fewer prompts per rollout"]


def absolute_path_notes(s: Settings) -> list[str]:
    """A warning per relative path the settings made absolute."""
    return [f"{name}={given} is a relative path: Ray runs the job in other working directories, so it is used as "
            f"{s[name]} (give an absolute path to choose)" for name, given in s.made_absolute.items()]
