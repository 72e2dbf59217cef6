"""The ``verl.plugins`` entry point (``pyproject.toml``): ``import verl`` loads this module in every process that
imports verl (``verl/__init__.py:55-76`` in 0.9.1), so the trainer ``mismatch_ctrl`` is registered wherever verl's
``TaskRunnerV1`` looks it up (``trainer/main_ppo.py:141``), whichever Ray process that is.

verl loads plugins inside ``except Exception`` and logs a failure at debug level only, after which the trainer name
is simply unknown. A failure here is raised as :class:`PluginLoadError`, a ``BaseException`` verl's handler does not
catch, so the process stops with the cause and the fix. ``VERL_USE_EXTERNAL_PLUGINS=none`` (or a list of other
plugins) keeps verl from loading it. A verl other than the tested release is a warning naming both versions.
"""

from __future__ import annotations

import logging

log = logging.getLogger("mismatch_ctrl")


class PluginLoadError(BaseException):
    """mismatch_ctrl's verl plugin failed to load: not an ``Exception``, so verl's plugin loop does not hide it."""


def _register() -> None:
    import verl

    from .checks import check_version
    warning = check_version(getattr(verl, "__version__", "unknown"))
    if warning:
        log.warning(warning)
    from . import trainer  # noqa: F401  (registers the trainer)


try:
    _register()
except Exception as exc:
    raise PluginLoadError(
        f"mismatch_ctrl's verl plugin failed to load ({type(exc).__name__}: {exc}); the trainer "
        "trainer.v1.trainer_mode=mismatch_ctrl would be unknown. Fix the installation (pip install -e . next to "
        "verl==0.9.1), or keep verl from loading the plugin with VERL_USE_EXTERNAL_PLUGINS=none") from exc
