"""The plugin through verl's own loading mechanism, in one fresh process (importing verl costs ~10 s of CPU, so both
checks share it): a plugin that fails to load stops ``import verl`` with the cause (verl itself would only log it at
debug level); once the installation is whole again, ``import verl`` loads the ``verl.plugins`` entry point of the
installed package and registers the trainer."""

from __future__ import annotations

import os
import subprocess
import sys

# 1. A broken install (the controllers module cannot be imported): verl's plugin loop, which catches Exception, must
#    let the error out of ``import verl``. 2. The same process, the module importable again: ``import verl`` runs
#    verl's __init__ (and its plugin loop) anew, since a failed import leaves no ``verl`` in sys.modules.
CODE = """
import sys
sys.modules['mismatch_ctrl.controllers'] = None
try:
    import verl
    print('imported despite the broken plugin')
except BaseException as exc:
    print('refused:', type(exc).__name__, exc, '| cause:', repr(exc.__cause__), '| verl loaded:', 'verl' in sys.modules)
del sys.modules['mismatch_ctrl.controllers']
import verl
from verl.trainer.ppo.v1 import get_trainer_cls
print('registered:', get_trainer_cls('mismatch_ctrl').__module__)
"""


def test_a_failed_load_is_an_error_and_import_verl_registers_the_trainer():
    environ = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", CODE], capture_output=True, text=True, env=environ,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    refused, registered = done.stdout.strip().splitlines()[-2:]
    assert refused.startswith("refused: PluginLoadError mismatch_ctrl's verl plugin failed to load "
                              "(ModuleNotFoundError"), refused
    assert "mismatch_ctrl.controllers" in refused and "VERL_USE_EXTERNAL_PLUGINS=none" in refused
    assert refused.endswith("| verl loaded: False")
    assert registered == "registered: mismatch_ctrl.verl.trainer"
