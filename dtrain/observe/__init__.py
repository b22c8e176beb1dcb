"""Observe: what a run tells the people watching it, as it goes and after.

Holds the recorder the trainer tells (:mod:`~dtrain.observe.recorder`) and
its parts: the run directory's files (:mod:`~dtrain.observe.rundir`), the
console (:mod:`~dtrain.observe.console`), the driver's side of the live
events (:mod:`~dtrain.observe.feed`) and the optional TensorBoard and MLflow
trackers (:mod:`~dtrain.observe.tracking`); on the scheduler, the plugin that keeps
each run's log (:mod:`~dtrain.observe.live`, :mod:`~dtrain.observe.runlog`),
the ``/dtrain`` page (:mod:`~dtrain.observe.livepage`) and the task timers
(:mod:`~dtrain.observe.metrics`); ``report.html``
(:mod:`~dtrain.observe.htmlreport`, its task charts
:mod:`~dtrain.observe.taskcharts`, the page :mod:`~dtrain.observe.htmlpage`
and the figures shared with the live page, :mod:`~dtrain.observe.figures`) and
task-graph pictures (:mod:`~dtrain.observe.drawing`).  It reads records and
is told what happened; it never drives a run.

May import: :mod:`dtrain.core`.
"""
