"""Test-run set-up shared by pytest and nbval.

Every kernel, cluster and engine of the run uses a private IPYTHONDIR (set
here, before anything starts), so the run can find and end exactly its own
processes: tests marked ``last`` run after every notebook, and
``pytest_sessionfinish`` ends whatever a failed test or a killed kernel left.
"""

import os
import shutil
import tempfile

import pytest
from hypothesis import settings

# CI explores the same examples every run (no flaky reds); locally hypothesis varies them.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

IPYTHON_DIR = tempfile.mkdtemp(prefix="coursekit-test-ipython-")
os.environ["IPYTHONDIR"] = IPYTHON_DIR
# Tests start their own clusters, except the run in which tests/clusters checks every
# notebook attached to an instructor-style cluster (it names that cluster here).
if os.environ.get("COURSEKIT_TEST_CLUSTER"):
    os.environ["COURSEKIT_CLUSTER"] = os.environ["COURSEKIT_TEST_CLUSTER"]
else:
    os.environ.pop("COURSEKIT_CLUSTER", None)
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiet debugpy in kernels
# every figure a panel draws or a notebook shows must keep the course's figure rules
# (coursekit.viz.check): broken rules raise in this run, in tests and in nbval's kernels
os.environ["COURSEKIT_STRICT_FIGURES"] = "1"


# numba's CUDA simulator must be on before numba.cuda is imported: a test beside each
# tests/**/*_cuda_sim.py runs it in its own process with NUMBA_ENABLE_CUDASIM=1
# (tests/cudasim.py); make test-gpu runs them on a real GPU with COURSEKIT_CUDA_TESTS=device.
collect_ignore_glob = ([] if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
                       or os.environ.get("COURSEKIT_CUDA_TESTS") == "device"
                       else ["tests/**/*_cuda_sim.py"])


def pytest_addoption(parser):
    parser.addoption(
        "--numerics", choices=("host", "off-host"), default="host",
        help="off-host: run the notebooks' kernels (and their engines) with NumPy's SIMD "
             "dispatch and Numba's target below this CPU's, as on another machine "
             "(coursekit.course.notebooks.off_host_numerics); make test passes it")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the first notebook cell starts its kernel, switch the run's environment to
    off-host numerics when asked (unit tests before it keep the host's)."""
    if item.config.getoption("numerics") == "off-host" and str(item.path).endswith(".ipynb"):
        from coursekit.course.notebooks import off_host_numerics

        os.environ.update(off_host_numerics())


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)


def pytest_sessionfinish(session):
    from coursekit.cluster.processes import end_cluster_processes

    end_cluster_processes(IPYTHON_DIR)
    shutil.rmtree(IPYTHON_DIR, ignore_errors=True)


@pytest.fixture
def ipython_dir():
    return IPYTHON_DIR
