"""Progress of a lab sweep. In a terminal: an overall bar (runs done, running, ETA) and one bar per running run,
warnings and finished runs printed above the bars, nothing left over once it closes. Without a terminal: a line when
each run starts and finishes, and every ``interval`` seconds a line with the running runs and the ETAs.

ETA of the sweep: remaining rollouts / rollouts per second since the first run started (all runs together).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from .sweep import RunTask


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class SweepProgress:
    """Consumes the executors' events (``start``, ``step``, ``warn``) and finished runs."""

    def __init__(self, tasks: list[RunTask], skipped: int = 0, enabled: bool = True, interval: float = 30.0,
                 stream: TextIO | None = None, terminal: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.interval = interval
        self.steps = {task.key: task.settings.steps for task in tasks}
        self.total_runs = len(tasks) + skipped
        self.finished = skipped
        self.done = dict.fromkeys(self.steps, 0)
        self.started: dict[tuple[str, int], float] = {}
        self.bars: dict[tuple[str, int], Any] = {}
        self.first: float | None = None
        self.last_line = time.monotonic()
        self.overall = None
        if enabled and self.terminal and tasks:
            from tqdm import tqdm

            self.overall = tqdm(total=sum(self.steps.values()), desc="sweep", unit="rollout", position=0, leave=False,
                                file=self.stream, dynamic_ncols=True)
            self._describe()

    @staticmethod
    def name(key: tuple[str, int]) -> str:
        return f"{key[0]} seed {key[1]}"

    def write(self, text: str) -> None:
        """A line above the bars (or a plain line without a terminal)."""
        if not self.enabled:
            return
        if self.overall is not None:
            self.overall.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def eta(self) -> str:
        """Time to the end of the sweep at the rate so far; ``?`` before the first rollout."""
        done = sum(self.done.values())
        if not done or self.first is None:
            return "?"
        rate = done / (time.monotonic() - self.first)
        return _duration((sum(self.steps.values()) - done) / rate)

    def run_eta(self, key: tuple[str, int]) -> str:
        done = self.done[key]
        if not done:
            return "?"
        return _duration((self.steps[key] - done) * (time.monotonic() - self.started[key]) / done)

    def _describe(self) -> None:
        if self.overall is not None:
            self.overall.set_postfix_str(f"runs {self.finished}/{self.total_runs} done, {len(self.started)} running",
                                         refresh=True)

    def event(self, event: tuple[Any, ...]) -> None:
        """One executor event."""
        kind, key = event[0], event[1]
        if kind == "warn":
            self.write(f"warning [{self.name(key)}]: {event[2]}")
        elif kind == "start":
            now = time.monotonic()
            self.first = self.first or now
            self.started[key] = now
            self.done[key] = 0
            if self.overall is not None:
                from tqdm import tqdm

                used = {bar.pos for bar in self.bars.values()}
                position = next(i for i in range(1, len(self.bars) + 2) if i not in used and -i not in used)
                self.bars[key] = tqdm(total=self.steps[key], desc=f"{self.name(key):<30}", unit="rollout",
                                      position=position, leave=False, file=self.stream, dynamic_ncols=True)
                self._describe()
            else:
                self.write(f"start {self.name(key)} ({self.steps[key]} rollouts); runs {self.finished}/"
                           f"{self.total_runs} done, {len(self.started)} running")
        elif kind == "step":
            self.done[key] += event[2]
            if key in self.bars:
                self.bars[key].update(event[2])
            if self.overall is not None:
                self.overall.update(event[2])
            elif self.enabled and time.monotonic() - self.last_line >= self.interval:
                self.last_line = time.monotonic()
                running = ", ".join(f"{self.name(k)} {self.done[k]}/{self.steps[k]} (ETA {self.run_eta(k)})"
                                    for k in self.started)
                self.write(f"progress: runs {self.finished}/{self.total_runs} done; running {running}; sweep ETA "
                           f"{self.eta()}")

    def finish(self, key: tuple[str, int], summary: dict[str, Any]) -> None:
        """A run finished (its folder is written)."""
        self.finished += 1
        started = self.started.pop(key, time.monotonic())
        bar = self.bars.pop(key, None)
        if bar is not None:
            bar.close()
        self._describe()
        self.write(f"done {self.name(key)} in {_duration(time.monotonic() - started)}: late accuracy "
                   f"{summary['late_acc_engine']:.3f}, late reward {summary['late_reward']:.3f}; runs "
                   f"{self.finished}/{self.total_runs} done, sweep ETA {self.eta()}")

    def close(self) -> None:
        """Remove every bar (the final lines are printed after it)."""
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()
        if self.overall is not None:
            self.overall.close()
            self.overall = None
