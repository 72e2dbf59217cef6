"""mismatch_ctrl: control the training-inference mismatch of RL with FP8 rollouts.

Framework-free core (torch only): :mod:`.batch` (the flat token batch), :mod:`.seqstats` (the one table of named
per-sequence statistics a hook call reads), :mod:`.signals`, :mod:`.metrics`, :mod:`.correction` and :mod:`.presets`
(IS/RS), :mod:`.dcgrpo`, :mod:`.lr_schedule`, :mod:`.acrl` (our interpretation of ACRL), :mod:`.controllers` (all of
them advanced once per rollout), :mod:`.config`, :mod:`.architecture` (dense or MoE), :mod:`.state`. slime users put
the functions of :mod:`mismatch_ctrl.slime.hooks` on slime's command line; ``mismatch-ctrl lab`` and
``mismatch-ctrl analyze`` are the CPU lab and the dump analyser; :mod:`mismatch_ctrl.launch` is the cluster
launchers' core (layout checks, memory estimate, the slime command).
"""

__version__ = "0.1.0"
