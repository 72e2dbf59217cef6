"""The sweep lock ``OUT/.lab.lock`` (issue 23, item 4): a lock file a killed lab left behind is taken over whatever
PID it names; a live lab is refused; a lock file that cannot be a lock is refused with the command that removes it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mismatch_ctrl import cli
from mismatch_ctrl.lab.sweeps import run as lab_run
from mismatch_ctrl.lab.sweeps.lock import LOCK_FILE, OutLock
from mismatch_ctrl.lab.sweeps.sweep import SweepError


@pytest.fixture
def other_process():
    """A live process that is not a lab (the PID a killed lab's lock names, given to another program since)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process.pid
    process.kill()
    process.wait()


@pytest.mark.parametrize("content", ["{other}\n", "{own}\n", "0\n", "-1\n", "99999999999999999999\n", "4194305\n",
                                     "", "not a pid\n", "\x00\xff garbage"])
def test_a_lock_file_nobody_holds_is_taken_over_whatever_pid_it_names(tmp_path, other_process, content):
    out = tmp_path / "out"
    out.mkdir()
    text = content.format(other=other_process, own=os.getpid())
    (out / LOCK_FILE).write_text(text, errors="surrogateescape")
    messages: list[str] = []
    with OutLock(out, messages.append):
        assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(SweepError, match=rf"another lab process \(pid {os.getpid()}\) is writing there"):
            OutLock(out).__enter__()
    assert not (out / LOCK_FILE).exists()
    if text.strip():
        assert len(messages) == 1 and messages[0].startswith(f"taking over the stale lock {out / LOCK_FILE} (left by ")
        assert messages[0].endswith(", which no longer holds it)")
    else:
        assert messages == []


def test_a_lab_holding_the_lock_in_another_process_is_refused_naming_its_pid(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from mismatch_ctrl.lab.sweeps.lock import OutLock\n"
                               f"with OutLock(Path({str(out)!r})):\n    print('held', flush=True)\n    time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(SweepError, match=rf"another lab process \(pid {holder.pid}\) is writing there"):
            OutLock(out).__enter__()
    finally:
        holder.kill()
        holder.wait()
    with OutLock(out, print):  # killed: the kernel released its lock, the file it left is taken over
        assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: os.mkfifo(p), lambda p: p.symlink_to("/etc/passwd"),
                                  lambda p: p.symlink_to(p.parent / "nowhere")])
def test_a_lock_path_that_cannot_be_a_lock_is_refused_with_how_to_remove_it(tmp_path, capsys, monkeypatch, make):
    out = tmp_path / "out"
    out.mkdir()
    make(out / LOCK_FILE)
    with pytest.raises(SweepError, match=rf"{out / LOCK_FILE} is not a regular file.*remove it \(rm -r "
                                         rf"{out / LOCK_FILE}\)"):
        OutLock(out).__enter__()
    assert os.path.lexists(out / LOCK_FILE)  # nothing removed behind the operator's back
    monkeypatch.setattr(lab_run, "warmup_policy", lambda *_, **__: pytest.fail("the warm-up must not start"))
    assert cli.main(["lab", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--methods", "grpo@none",
                     "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "is not a regular file, so it cannot be the lab's lock" in err and "Traceback" not in err
