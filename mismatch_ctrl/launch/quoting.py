"""How a value reaches the cluster through ``ray job submit`` unchanged.

Ray's job server runs the entrypoint (the words after ``--``) as one string with ``/bin/sh`` (``subprocess.Popen(...,
shell=True)`` in ``ray/dashboard/modules/job/job_supervisor.py``). The ``ray job submit`` CLI joins the words into
that string: Ray >= 2.56 with ``shlex.join`` (every word arrives as it was), older Ray with
``subprocess.list2cmdline`` (double quotes around a word with a space, nothing else), so that the cluster's shell
would expand a ``$`` in a path. For an older Ray the words are single-quoted here (:func:`for_ray`); a word that
``list2cmdline`` would double-quote and that holds ``$``, a backquote, a backslash or a double quote cannot be passed
through it and is refused (:func:`entrypoint_problems`).

The runtime environment's ``env_vars`` are applied on every node with ``os.path.expandvars`` followed by the removal
of any ``${NAME}`` left (``ray._private.utils.update_envs``): there is no escape for ``$`` there, so a value such as a
PYTHONPATH directory holding ``$NAME`` or ``${...}`` is refused (:func:`runtime_env_problems`), as is a ``:`` in a
directory that goes into PYTHONPATH (it would split the path).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Sequence

from .settings import Settings

SHLEX_JOIN = (2, 56)
"""The first Ray whose ``ray job submit`` joins the entrypoint with ``shlex.join`` (2.55.1 uses list2cmdline)."""
_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_EXPANDED = re.compile(r"\$(\w+|\{[^}]*\})")
_DOUBLE_QUOTED_SPECIAL = re.compile(r'[$`\\"]')
_SHELL_REWRITES = re.compile(r"[$`\\\"'\s;&|<>()]")
"""What an unquoted word's characters mean to /bin/sh beyond a glob (which leaves a word that matches no file)."""


def ray_version() -> tuple[int, int] | None:
    """(major, minor) of the ``ray`` on PATH (``ray --version``), None without one or when it does not say."""
    if shutil.which("ray") is None:
        return None
    try:
        done = subprocess.run(["ray", "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"version (\d+)\.(\d+)", done.stdout) if done.returncode == 0 else None
    return (int(found.group(1)), int(found.group(2))) if found else None


def _old_ray_word(word: str) -> str | None:
    """``word`` as an older Ray's list2cmdline must receive it so that ``/bin/sh`` reads it back unchanged; None
    when no spelling survives both."""
    if _SAFE.fullmatch(word):
        return word
    if " " in word or "\t" in word or not word:
        return None if _DOUBLE_QUOTED_SPECIAL.search(word) else word  # list2cmdline's double quotes suffice
    if '"' in word:
        return None
    return "'" + word.replace("'", "'\\''") + "'"


def for_ray(words: Sequence[str], version: tuple[int, int] | None) -> list[str]:
    """The entrypoint words to give ``ray job submit`` so that the job receives ``words``: as they are for Ray >=
    2.56 (or an unknown Ray), single-quoted where needed for an older one."""
    if version is None or version >= SHLEX_JOIN:
        return list(words)
    return [_old_ray_word(word) or word for word in words]


def _source(s: Settings, word: str) -> str:
    names = [name for name, value in s.values.items() if value and not _SAFE.fullmatch(value) and value in word]
    return f" (from {', '.join(names)})" if names else ""


def entrypoint_problems(s: Settings, words: Sequence[str], version: tuple[int, int] | None) -> list[str]:
    """Words an older Ray cannot pass to the cluster's shell unchanged, naming the setting they come from."""
    if version is None or version >= SHLEX_JOIN:
        return []
    return [f"{word!r}{_source(s, word)} cannot reach train.py unchanged: Ray {version[0]}.{version[1]} (older than "
            f"{SHLEX_JOIN[0]}.{SHLEX_JOIN[1]}) joins the ray job submit command with subprocess.list2cmdline and the "
            "cluster's /bin/sh would read this word differently; rename the path, or run ray job submit from Ray >= "
            f"{SHLEX_JOIN[0]}.{SHLEX_JOIN[1]}" for word in words if _old_ray_word(word) is None]


def unknown_ray_problems(s: Settings, words: Sequence[str]) -> list[str]:
    """Without a Ray version (no ``ray`` on PATH, or one that does not say it): the words whose arrival depends on it
    (a warning in a dry run off the cluster, an error at launch)."""
    shaky = [word for word in words if _SHELL_REWRITES.search(word)]
    if not shaky:
        return []
    named = ", ".join(repr(word) + _source(s, word) for word in shaky[:3])
    return [f"cannot ask ray its version (no ray on PATH, or `ray --version` does not say it): the command assumes "
            f"Ray >= {SHLEX_JOIN[0]}.{SHLEX_JOIN[1]}, which passes {named} to train.py unchanged; an older Ray would "
            "not"]


def runtime_env_problems(s: Settings) -> list[str]:
    """Values of the job's runtime-env ``env_vars`` that Ray would change on the cluster, naming their variable."""
    values = {name: s[name] for name in ("MEGATRON_DIR", "SLIME_DIR", "REPO_ROOT", "DATA_DIR", "TENSORBOARD_DIR")}
    values.update({name: s.environ[name] for name in s.pass_env if name in s.environ})
    out = [f"{name}={value} holds {_EXPANDED.search(value).group(0)}, which Ray expands on every node when it sets the "
           "job's environment (runtime-env env_vars pass through os.path.expandvars, with no escape for $): rename "
           "the path" + (" or leave the variable out of PASS_ENV" if name in s.pass_env else "")
           for name, value in values.items() if _EXPANDED.search(value)]
    out += [f"{name}={s[name]} holds ':', which splits the job's PYTHONPATH ({name} is one of its entries): rename "
            "the path" for name in ("MEGATRON_DIR", "SLIME_DIR", "REPO_ROOT") if ":" in s[name]]
    return out
