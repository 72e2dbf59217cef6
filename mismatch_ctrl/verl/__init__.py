"""verl adapter: the only code that knows verl 0.9.1's trainer, workers and configuration.

A verl user selects the trainer :mod:`mismatch_ctrl.verl.trainer` registers (``trainer.v1.trainer_mode=mismatch_ctrl``)
and names the method YAML the slime hooks read (``+mismatch_ctrl.config=configs/methods/dcgrpo.yaml``); the plugin
(:mod:`mismatch_ctrl.verl.plugin`, loaded by ``import verl`` through the ``verl.plugins`` entry point) registers it.
``checks``, ``lr``, ``recipe`` and ``runtime`` need no verl (the launchers' ``--help`` and the core-side checks use
them); ``trainer``, ``workers``, ``transport``, ``launch`` and ``plugin`` import it. docs/verl.md is the user's page.
"""
