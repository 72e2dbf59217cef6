"""CPU lab: a tiny but real RL problem whose rollouts come from an FP8-quantised copy of an fp32 policy.

Same arrangement as FP8 SGLang rollouts + BF16 Megatron training, so the training-inference mismatch is real. Four
rooms, each importing only the rooms above it in this list (``tests/lab/test_lab_rooms.py`` guards it):

- ``model``: the verifiable tasks, the tiny decoder-only policy (dense or mixture-of-experts, with routing replay),
  the quantisers (FP8, FP4, INT4, BF16) and the rollout engine, routing flips, the discrepancy floor and the cached
  supervised warm-up;
- ``training``: what a run is (``RunSpec``: method, engine, replay; ``LabSettings``), GRPO through ``mismatch_ctrl``'s
  slime hooks exactly as slime calls them (``trainer``), and one run's summary;
- ``results``: finished runs read once into one table (``table``), the analyses as pure functions of it (statistics
  over seeds, paired differences, the frontier, controller against GRPO, pooling, interactions), and renderers
  (``report.md``, ``summary.json``, plots);
- ``sweeps``: the command's options and presets, planning and committing run folders, integrity checks, locks,
  budgets, executors (processes, Ray), progress, and ``run``: the pipeline of ``mismatch-ctrl lab``.

Only the CLI and the benchmarks import the lab; the core, the slime adapter, ``analyze`` and ``launch`` never do.
"""
