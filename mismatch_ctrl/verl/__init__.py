"""verl adapter: the only code that knows verl 0.9.1's trainer, workers and configuration.

A verl user selects the trainer :mod:`mismatch_ctrl.verl.trainer` registers (``trainer.v1.trainer_mode=mismatch_ctrl``)
and names the method YAML the slime hooks read (``+mismatch_ctrl.config=configs/methods/dcgrpo.yaml``); the plugin
(:mod:`mismatch_ctrl.verl.plugin`, loaded by ``import verl`` through the ``verl.plugins`` entry point) registers it.
Everything here imports verl lazily except the modules that need no verl at all (``advantage``, ``checks``, ``lr``,
``runtime``). docs/verl.md is the user's page.
"""
