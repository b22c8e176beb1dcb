"""What the tests share that is not a test: importable as ``helpers`` (``from helpers import
mpirun``, ``from helpers.sockets import listening``), because pytest puts ``tests/`` on
``sys.path`` for ``tests/conftest.py`` (no ``__init__.py`` in ``tests/``: the rootdir-based
"prepend" import mode).  A script launched by path (``stranger.py``, ``mpi_fault.py``,
``sweep_child.py``) gets ``tests/`` from ``PYTHONPATH`` where it imports a helper.

Nothing here is collected: pytest collects ``tests/test_*.py`` only.

* ``browser``: headless Chromium driven by Selenium, for the pages' tests;
* ``datafiles``: IDX files, a tiny MNIST and image folders written for the data tests;
* ``estimators_common``: iris as the estimator tests take it, a quick classifier, the
  embedded cluster closed with each module;
* ``gradients``: central differences, for the gradient checks;
* ``live``: a free port, an HTTP get, a Prometheus gauge, a process stopped with Ctrl-C;
* ``mpirun``: real ``mpiexec`` jobs (MPICH from the venv, else Open MPI);
* ``sockets``: what a process tree listens on (psutil);
* ``mpi_fault.py``, ``stranger.py``, ``sweep_child.py``: scripts the tests run as processes
  of their own.
"""
