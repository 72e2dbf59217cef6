"""The plugin through verl's own loading mechanism, in fresh processes: ``import verl`` loads the ``verl.plugins``
entry point of the installed package and registers the trainer; a plugin that fails to load stops the process with
the cause (verl itself would only log it at debug level)."""

from __future__ import annotations

import os
import subprocess
import sys

LOOKUP = ("import verl; from verl.trainer.ppo.v1 import get_trainer_cls; "
          "print(get_trainer_cls('mismatch_ctrl').__module__)")


def run(code: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                          env=environ, timeout=400)


def test_import_verl_registers_the_trainer():
    done = run(LOOKUP)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "mismatch_ctrl.verl.trainer"


def test_a_plugin_that_fails_to_load_is_an_error():
    """A broken install (here: the controllers module cannot be imported) stops ``import verl`` with the cause."""
    done = run("import sys; sys.modules['mismatch_ctrl.controllers'] = None; import verl; print('imported')")
    assert done.returncode != 0 and "imported" not in done.stdout
    assert "PluginLoadError: mismatch_ctrl's verl plugin failed to load (ModuleNotFoundError" in done.stderr
    assert "mismatch_ctrl.controllers" in done.stderr
    assert "VERL_USE_EXTERNAL_PLUGINS=none" in done.stderr
