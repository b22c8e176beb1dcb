"""A held-out split's evaluation as tasks: on the held-out shard where the updates run, or,
held-out data in parts beside their partitions, a task per part and their sum (the
builders add one at each epoch's end; the run's end adds the test split's)."""
from __future__ import annotations

from dask.task_spec import Task, TaskRef

from dtrain.core import keys
from dtrain.taskgraph.records import Evaluate
from dtrain.taskgraph.tasks import evaluate, evaluate_part, evaluate_parts
from dtrain.taskgraph.window import Window

HeldOut = TaskRef | tuple[tuple[TaskRef, str], ...] | None   # one shard, or parts where they are


def add_evaluation(win: Window, task: Evaluate, state: str, held: HeldOut, root: str,
                   run: str) -> str:
    """``evaluate-<epoch>`` (``evaluate-test``) on the held-out shard, or, held-out data in
    parts on their workers, ``evaluate-<epoch>-<part>`` beside each part and their sum on
    ``root``; returns the key of the result."""
    kind, tag = (keys.EVALUATE_TEST, ()) if task.epoch < 0 else (keys.EVALUATE, (task.epoch + 1,))
    if not isinstance(held, tuple):
        return win.add(Task(keys.make(kind, *tag, run=run), evaluate, task, TaskRef(state),
                            held), root)
    sums = [win.add(Task(keys.make(kind, *tag, i, run=run), evaluate_part, task, TaskRef(state),
                         ref), worker) for i, (ref, worker) in enumerate(held)]
    return win.add(Task(keys.make(kind, *tag, run=run), evaluate_parts, task, TaskRef(state),
                        *map(TaskRef, sums)), root)
