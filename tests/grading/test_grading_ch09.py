"""The chapter-9 check passes chapter 3's step wrapped in DDP with an averaging hook, and
fails the plausible mistakes with a message that names them."""

import pytest

from coursekit.cluster.runner import ClusterRunner
from coursekit.comm import setup_comm
from coursekit.grading.ch09 import check_ddp_wrap

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def engines(cluster2):
    setup_comm(cluster2, timeout=30)
    return ClusterRunner(cluster2)


def typed_in_a_notebook(fn):
    """``fn`` as if defined in the student's notebook (``__main__``): ipyparallel ships it
    by value instead of importing this test module on the engines."""
    fn.__module__ = "__main__"
    return fn


def hooked(divide: bool, cap=None):
    """A student's wrap_in_ddp whose hook divides by p (or forgets to); ``cap`` overrides
    the bucket cap it passes to DDP."""
    def wrap_in_ddp(model, bucket_cap_mb):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb if cap is None else cap)

        def hook(state, bucket):
            tensor = bucket.buffer()
            if divide:
                tensor.div_(dist.get_world_size())
            return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])

        ddp.register_comm_hook(None, hook)
        return ddp
    return typed_in_a_notebook(wrap_in_ddp)


def test_accepts_ddp_with_an_averaging_hook(engines):
    result = check_ddp_wrap(hooked(divide=True), engines, quiet=True)
    assert result, result.message
    assert "2(p-1)/p N 8" in result.message


def test_rejects_a_hook_that_forgets_to_average(engines):
    result = check_ddp_wrap(hooked(divide=False), engines, quiet=True)
    assert result.status == "fail"
    assert "without dividing by the world size" in result.message and "p=2" in result.message


def test_rejects_ddp_without_a_hook(engines):
    def no_hook(model, bucket_cap_mb):
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    result = check_ddp_wrap(typed_in_a_notebook(no_hook), engines, quiet=True)
    assert result.status == "fail" and "register a communication hook" in result.message


def test_rejects_a_wrong_bucket_cap_and_a_bare_model(engines):
    result = check_ddp_wrap(hooked(divide=True, cap=25), engines, quiet=True)
    assert result.status == "fail" and "pass bucket_cap_mb=bucket_cap_mb" in result.message
    result = check_ddp_wrap(typed_in_a_notebook(lambda model, cap: model), engines, quiet=True)
    assert result.status == "fail" and "returned Sequential" in result.message


def test_a_stub_is_todo(engines):
    def stub(model, bucket_cap_mb):
        raise NotImplementedError
    assert check_ddp_wrap(typed_in_a_notebook(stub), engines, quiet=True).status == "todo"
