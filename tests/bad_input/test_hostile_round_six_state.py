"""Bad input, round six, part 2: controller state files and resume (truncated, tampered, other kinds of file), the
Megatron tracker beside them. See ``test_hostile_round_six.py`` for the round."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
from hostile import kept, judge, refused
from test_bad_input_corpus import DCGRPO, LENGTH_DECAY, resume, saved_run

from mismatch_ctrl.errors import StateError
from mismatch_ctrl.slime.runtime import get_runtime

TRACKER = "latest_checkpointed_iteration.txt"


def resumed(damage: Callable[[Path, Path], Any], section: Any = DCGRPO) -> Callable[[Path], Any]:
    """Save three rollouts (checkpoint 2), apply ``damage(tmp, state_file)``, resume; the runtime."""
    def run(tmp: Path) -> Any:
        damage(tmp, saved_run(tmp, section))
        return get_runtime(resume(tmp, section))
    return run


def edited(change: Callable[[dict[str, Any]], Any], section: Any = DCGRPO) -> Callable[[Path], Any]:
    def damage(tmp: Path, path: Path) -> None:
        document = json.loads(path.read_text())
        change(document)
        path.write_text(json.dumps(document))
    return resumed(damage, section)


def text(replace: tuple[str, str]) -> Callable[[Path], Any]:
    return resumed(lambda t, p: p.write_text(p.read_text().replace(*replace, 1)))


def dc(**values: Any) -> Callable[[Path], Any]:
    return edited(lambda d: d["state"]["dcgrpo"].update(values))


def surge(**values: Any) -> Callable[[Path], Any]:
    return edited(lambda d: d["state"]["surge"].update(values), LENGTH_DECAY)


def tracker(content: str | bytes) -> Callable[[Path], Any]:
    def damage(tmp: Path, path: Path) -> None:
        (tmp / TRACKER).write_bytes(content.encode() if isinstance(content, str) else content)
    return resumed(damage)


def replaced(path_of: Callable[[Path, Path], Path], make: Callable[[Path], Any]) -> Callable[[Path], Any]:
    def damage(tmp: Path, path: Path) -> None:
        target = path_of(tmp, path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
        make(target)
    return resumed(damage)


STATE_FILE = lambda t, p: p  # noqa: E731
TRACKER_FILE = lambda t, p: t / TRACKER  # noqa: E731
FRESH = "state.resume: fresh"


def bad(run: Callable[[Path], Any], *needles: str) -> Any:
    return refused(run, StateError, *needles)


STATE = {
    "the file cut in half": bad(resumed(lambda t, p: p.write_bytes(p.read_bytes()[:200])), "unreadable mismatch_ctrl "
                                "state", FRESH),
    "an empty file": bad(resumed(lambda t, p: p.write_bytes(b"")), "unreadable mismatch_ctrl state"),
    "a UTF-8 BOM": bad(resumed(lambda t, p: p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())), "state_0000002.json",
                       "BOM"),
    "UTF-16": bad(resumed(lambda t, p: p.write_bytes(p.read_text().encode("utf-16"))), "not UTF-8 text"),
    "a FIFO": bad(replaced(STATE_FILE, os.mkfifo), "a FIFO (named pipe)", "--finetune"),
    "a symbolic link to itself": bad(replaced(STATE_FILE, lambda p: p.symlink_to(p)), "symbolic links"),
    "a broken symbolic link": bad(replaced(STATE_FILE, lambda p: p.symlink_to(p.parent / "gone.json")),
                                  "a broken link"),
    "lam NaN as JSON text": bad(text(('"lam": ', '"lam": NaN, "_": ')), "state.dcgrpo"),
    "lam given twice": bad(text(('"lam": ', '"lam": 0.5, "lam": ')), "duplicate key 'lam'"),
    "version 99": bad(edited(lambda d: d.update(version=99)), "state version 99 is not supported"),
    "version true": bad(edited(lambda d: d.update(version=True)), "state version True is not supported"),
    "version '3'": bad(edited(lambda d: d.update(version="3")), "state version '3' is not supported"),
    "another format": bad(edited(lambda d: d.update(format="other")),
                          "not a mismatch_ctrl state file (format 'other')"),
    "no format": bad(edited(lambda d: d.pop("format")), "not a mismatch_ctrl state file (format None)"),
    "a JSON list": bad(resumed(lambda t, p: p.write_text("[]")), "not a mismatch_ctrl state file"),
    "JSON null": bad(resumed(lambda t, p: p.write_text("null")), "not a mismatch_ctrl state file"),
    "another rollout_id": bad(edited(lambda d: d.update(rollout_id=5)), "rollout_id 5, expected 2"),
    "rollout_id 2.0": bad(edited(lambda d: d.update(rollout_id=2.0)), "rollout_id 2.0, expected 2"),
    "state null": bad(edited(lambda d: d.update(state=None)), "state: expected the controllers' mapping, got None"),
    "state a list": bad(edited(lambda d: d.update(state=[1])), "state: expected the controllers' mapping, got [1]"),
    "lam a string": bad(dc(lam="0.1"), "state.dcgrpo.lam: must be a number, got '0.1'"),
    "lam true": bad(dc(lam=True), "state.dcgrpo.lam: must be a number, got True"),
    "eps 0": bad(dc(eps=0.0), "state.dcgrpo.eps: 0 is below the run's eps 0.005"),
    "eps 5": bad(dc(eps=5.0), "state.dcgrpo.eps: 5", "above", "the file was edited"),
    "eps -0.01": bad(dc(eps=-0.01), "state.dcgrpo.eps: must be >= 0"),
    "streak of strings": bad(dc(streak=["a"]), "state.dcgrpo.streak: item 0 must be a number, got 'a'"),
    "lifts -1": bad(dc(lifts=-1), "state.dcgrpo.lifts: must be an integer >= 0"),
    "lifts 1.5": bad(dc(lifts=1.5), "state.dcgrpo.lifts: must be an integer >= 0"),
    "no lam": bad(edited(lambda d: d["state"]["dcgrpo"].pop("lam")), "state.dcgrpo.lam: missing"),
    "lamda, a misspelt key": bad(dc(lamda=0.1), "state.dcgrpo.lamda: unknown key"),
    "nested 50 deep": bad(resumed(lambda t, p: p.write_text('{"a":' * 50 + "1" + "}" * 50)), "nested deeper"),
    "17 MiB": bad(resumed(lambda t, p: p.write_text(" " * (17 << 20) + p.read_text())), "larger than 16 MiB"),
    "surge lengths -1": bad(surge(lengths=[-1.0]), "state.surge.lengths: item 0 must be >= 0"),
    "surge history of other lengths": bad(surge(lengths=[1.0, 2.0, 3.0, 4.0]), "state.surge.short_means",
                                          "inconsistent"),
    "surge triggered without an onset": bad(surge(triggered_at=1), "state.surge.triggered_at: 1 without an onset"),
    "surge start 2**60": bad(surge(start=2**60), "state.surge.start", "below 2**53"),
    "the state folder a file": bad(resumed(lambda t, p: (shutil.rmtree(p.parent), p.parent.write_text("x"))),
                                   "no mismatch_ctrl state for rollout 2"),
    "only a later rollout's state": bad(resumed(lambda t, p: p.rename(p.with_name("state_0000009.json"))),
                                        "state files present for rollouts [0, 1, 9]"),
    # the tracker beside it
    "tracker a full-width 2": bad(tracker("\uff12"), f"{TRACKER}: holds '\uff12'"),
    "tracker of 5000 digits": bad(tracker("9" * 5000), "longer than Megatron's tracker"),
    "tracker a FIFO": bad(replaced(TRACKER_FILE, os.mkfifo), f"{TRACKER}: not a regular file (a FIFO (named pipe))"),
    "tracker bytes that are not UTF-8": bad(tracker(b"\xff\xfe2"), f"{TRACKER}: holds"),
    "tracker 2.0": bad(tracker("2.0"), "holds '2.0'"),
    # accepted as written
    "tracker with spaces and a newline": kept(tracker("  2  \n"), lambda runtime: runtime.next_rollout == 3),
    "the state file a link to a good copy": kept(resumed(lambda t, p: (shutil.copy(p, t / "copy.json"), p.unlink(),
                                                                       p.symlink_to(t / "copy.json"))),
                                                 lambda runtime: runtime.next_rollout == 3),
    "lam above lambda_max: clipped": kept(dc(lam=1e9), lambda runtime: runtime.controllers.dcgrpo.lam == 1.0),
}


@pytest.mark.parametrize("case", STATE)
def test_state(case, tmp_path):
    judge(STATE[case], tmp_path)
