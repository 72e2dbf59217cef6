"""The lab's tasks by name."""

from __future__ import annotations

from .digitsum import DigitSumTask
from .task import AdditionTask, LongReverseTask, ReverseTask, Task

TASKS: dict[str, type[Task]] = {"add": AdditionTask, "reverse": ReverseTask, "reverse-long": LongReverseTask,
                                "digitsum": DigitSumTask}


def make_task(name: str, **options: object) -> Task:
    """Task by name (``"add"``, ``"reverse"``, ``"reverse-long"`` or ``"digitsum"``) with constructor options, e.g.
    ``make_task("add", seed=3)``."""
    if name not in TASKS:
        raise ValueError(f"task: unknown name {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name](**options)
