"""What the tests share that is not a test: importable as ``helpers`` (``from helpers import
mpirun``, ``from helpers.sockets import listening``), because pytest puts ``tests/`` on
``sys.path`` for ``tests/conftest.py`` (no ``__init__.py`` in ``tests/``: the rootdir-based
"prepend" import mode).  A script launched by path (``stranger.py``, ``mpi_fault.py``,
``sweep_child.py``) gets ``tests/`` from ``PYTHONPATH`` where it imports a helper.

Nothing here is collected: pytest collects ``tests/test_*.py`` only.

* ``browser``: headless Chromium driven by Selenium, for the pages' tests;
* ``cli``: the command line run in this process, through ``dtrain.cli.main``;
* ``datafiles``: IDX files, a tiny MNIST and image folders written for the data tests;
* ``estimators_common``: iris and digits as the estimator tests take them, a quick
  classifier, scikit-learn's MLPs beside dtrain's and scikit-learn's stopping rule, the
  embedded cluster closed with each module;
* ``gradients``: central differences, for the gradient checks;
* ``live``: a free port, an HTTP get, a Prometheus gauge, a process stopped with Ctrl-C;
* ``memory``: a process's allocator statistics (glibc's ``mallinfo2``);
* ``mpirun``: real ``mpiexec`` jobs (MPICH from the venv, else Open MPI);
* ``sockets``: what a process tree listens on (psutil);
* ``tables``: iris with short column names, a CSV of a table with cells replaced;
* ``transfers``: the bytes a run moved between workers against its graphs' prediction;
* ``windows_here``: a window as the engine's builder makes it, run in this process;
* ``mpi_fault.py``, ``stranger.py``, ``sweep_child.py``: scripts the tests run as processes
  of their own.
"""
