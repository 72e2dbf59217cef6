"""slime adapters: the only code that knows slime's and Megatron's calling conventions.

Users put the functions of :mod:`mismatch_ctrl.slime.hooks` on slime's command line.
"""
