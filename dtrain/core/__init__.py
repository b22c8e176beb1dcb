"""Core: what every other part of dtrain may use.

Holds the run configuration (:mod:`~dtrain.core.config`: its schema, its rules across
keys, each strategy's among them, and its loading; its fields' declaring and checking,
:mod:`~dtrain.core.fields`), the errors and exit
codes (:mod:`~dtrain.core.errors`), the task-key grammar
(:mod:`~dtrain.core.keys`), the live-event port (:mod:`~dtrain.core.events`),
host/GPU array helpers (:mod:`~dtrain.core.arrays`), file conventions
(:mod:`~dtrain.core.files`), calls on every worker that a leaving worker does not
break (:mod:`~dtrain.core.broadcast`), how computing processes allocate
(:mod:`~dtrain.core.allocator`) and every use of distributed's private API
(:mod:`~dtrain.core.internals`).

May import: nothing else of dtrain.
"""
