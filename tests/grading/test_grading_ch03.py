"""The chapter-3 check passes the solution and fails the usual mistakes with a hint."""

import numpy as np
import pytest

from coursekit.collectives import allreduce
from coursekit.grading.ch03 import check_data_parallel_step


def make_step(weighting="share", communicate=True):
    def dp_step(comm, mlp, X, y, batch_size, lr):
        loss, grad = mlp.loss_and_grad(X, y)
        w = {"share": len(X) / batch_size, "one": 1.0, "mean": 1.0 / comm.size}[weighting]
        total = allreduce(comm, grad * w) if communicate else grad * w
        mlp.params[...] -= lr * total
        return loss
    return dp_step


def test_the_solution_passes():
    result = check_data_parallel_step(make_step(), quiet=True)
    assert result, result.message


def test_summing_without_weights_fails_with_a_hint():
    result = check_data_parallel_step(make_step("one"), quiet=True)
    assert not result and "summed the gradients without dividing" in result.message


def test_one_over_p_fails_on_uneven_shards():
    result = check_data_parallel_step(make_step("mean"), quiet=True)
    assert not result and "averaged with 1/p" in result.message
    assert "p=3 ranks with a global batch of 10" in result.message  # even shards passed


def test_no_communication_fails():
    result = check_data_parallel_step(make_step(communicate=False), quiet=True)
    assert not result and "sent and received no message" in result.message


def test_ranks_that_disagree_fail():
    def lopsided(comm, mlp, X, y, batch_size, lr):
        loss = make_step()(comm, mlp, X, y, batch_size, lr)
        if comm.rank == 1:
            mlp.params[0] += 1.0
        return loss
    result = check_data_parallel_step(lopsided, quiet=True)
    assert not result and "rank 1 ended with parameters different from rank 0's" in result.message


def test_the_stub_says_todo():
    def stub(comm, mlp, X, y, batch_size, lr):
        raise NotImplementedError("write the step")
    assert check_data_parallel_step(stub, quiet=True).status == "todo"


def test_a_crashing_student_function_is_reported_plainly():
    def broken(comm, mlp, X, y, batch_size, lr):
        return np.linalg.inv(np.zeros((2, 2)))
    result = check_data_parallel_step(broken, quiet=True)
    assert not result and "your function raised LinAlgError" in result.message


# ---- local SGD (exercise 03_local_sgd) ----

from coursekit.cluster.runner import LocalRunner  # noqa: E402
from coursekit.grading.ch03 import SIZES, check_local_sgd, local_sgd_reference  # noqa: E402
from coursekit.nn import MLP, train  # noqa: E402
from coursekit.parallel import data_parallel  # noqa: E402
from coursekit.parallel.data_parallel import DPConfig  # noqa: E402
from coursekit.parallel.data_parallel.sampler import Sampler  # noqa: E402

TOL = dict(rtol=1e-10, atol=1e-12)


def make_local_sgd(final=True, share="rows", every=None):
    def local_sgd(comm, mlp, batches, batch_size, lr, k):
        rows, since = 0, 0
        for step, (X, y) in enumerate(batches):
            mlp.params[...] -= lr * mlp.loss_and_grad(X, y)[1]
            rows, since = rows + len(X), since + 1
            if (step + 1) % (every or k) == 0 or (final and step == len(batches) - 1):
                w = {"rows": rows / (since * batch_size), "p": 1 / comm.size, "one": 1.0}[share]
                mlp.params[...] = allreduce(comm, mlp.params * w)
                rows, since = 0, 0
    return local_sgd


def sampled(X, y, batch, p, steps, seed=0):
    """Each rank's (X, y) per step, in the library's order (its Sampler)."""
    def rank(r):
        sampler = Sampler(len(X), batch, seed)  # steps in order: one sampler per rank
        return [(X[rows], y[rows]) for rows in (sampler.local(s, r, p)[0] for s in range(steps))]
    return [rank(r) for r in range(p)]


@pytest.mark.parametrize("p, batch, k, steps", [(3, 10, 2, 7), (4, 9, 3, 6), (2, 8, 1, 5)])
def test_the_reference_is_the_librarys_local_sgd(p, batch, k, steps):
    """The check's serial reference = data_parallel.train with exchange='average' on threads."""
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((60, SIZES[0])), rng.integers(0, SIZES[-1], 60)
    cfg = DPConfig(sizes=SIZES, dtype="float64", batch_size=batch, epochs=10, max_steps=steps,
                   lr=0.3, exchange="average", average_every=k, seed=0, publish_interval=0.0)
    library = data_parallel.train(LocalRunner(p), cfg, (X, y))
    np.testing.assert_allclose(local_sgd_reference(sampled(X, y, batch, p, steps), batch, 0.3, k),
                               library.params, **TOL)


def test_the_reference_with_k1_is_serial_sgd_on_the_whole_batch():
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((40, SIZES[0])), rng.integers(0, SIZES[-1], 40)
    serial = MLP(SIZES, dtype=np.float64, seed=0)
    train(serial, X, y, epochs=1, batch_size=10, lr=0.3, seed=0)
    np.testing.assert_allclose(local_sgd_reference(sampled(X, y, 10, 3, 4), 10, 0.3, 1),
                               serial.params, **TOL)


def test_local_sgd_solution_passes():
    result = check_local_sgd(make_local_sgd(), quiet=True)
    assert result, result.message


@pytest.mark.parametrize("mistake, message", [
    (dict(final=False), "did not average after the last step"),
    (dict(share="p"), "weighted each rank by 1/p"),
    (dict(share="one"), "summed the parameters without weights"),
    (dict(every=1), "averaged after every step"),
])
def test_local_sgd_mistakes_fail_with_a_hint(mistake, message):
    result = check_local_sgd(make_local_sgd(**mistake), quiet=True)
    assert not result and message in result.message, result.message


def test_local_sgd_without_communication_fails():
    def alone(comm, mlp, batches, batch_size, lr, k):
        for X, y in batches:
            mlp.params[...] -= lr * mlp.loss_and_grad(X, y)[1]
    result = check_local_sgd(alone, quiet=True)
    assert not result and "sent and received no message" in result.message


def test_local_sgd_stub_says_todo():
    def stub(comm, mlp, batches, batch_size, lr, k):
        raise NotImplementedError("write local SGD")
    assert check_local_sgd(stub, quiet=True).status == "todo"
