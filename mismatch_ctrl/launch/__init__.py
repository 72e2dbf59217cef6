"""The core of the cluster launchers (``launch/*.sh``): ``python -m mismatch_ctrl.launch``.

Torch-free (the standard library and PyYAML), so ``--dry-run`` works on a laptop. Modules, in the order a launch
uses them: :mod:`.settings` (environment variables and their defaults), :mod:`.profiles` (per-model layout defaults
and recorded model shapes), :mod:`.model_shape` (a model's numbers from a Hugging Face ``config.json`` or Megatron's
model arguments), :mod:`.layout` (the parallel-layout rules of Megatron and SGLang), :mod:`.memory` (per-GPU and host
memory estimate), :mod:`.command` (the ``ray job submit`` command), :mod:`.preflight` (paths and cluster),
:mod:`.prepare` (data and checkpoint conversion), :mod:`.imports` (the preflight's import check, run in the job's
PYTHONPATH), :mod:`.main` (the modes and exit codes).
"""
