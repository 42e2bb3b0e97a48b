"""AlexNet's two-GPU split: parameters and bytes exchanged per GPU, checked by hand arithmetic."""

import pytest

from coursekit.parallel.alexnet_split import ALEXNET, SplitLayer, alexnet_split


def test_parameters_per_gpu_are_half_of_every_layers_kernels():
    r = alexnet_split()
    # kernels/2 x (weights per kernel + 1 bias), layer by layer from the paper's Figure 2
    by_hand = {"conv1": 48 * (11 * 11 * 3 + 1), "conv2": 128 * (5 * 5 * 48 + 1),
               "conv3": 192 * (3 * 3 * 256 + 1), "conv4": 192 * (3 * 3 * 192 + 1),
               "conv5": 128 * (3 * 3 * 192 + 1), "fc6": 2048 * (9216 + 1),
               "fc7": 2048 * (4096 + 1), "fc8": 500 * (4096 + 1), "softmax": 0}
    assert {k: v[0] for k, v in r.per_layer.items()} == by_hand
    assert r.params_per_gpu == 30_482_612  # 2 x 30.5 M = the paper's "60 million parameters"
    assert r.param_bytes_per_gpu == 4 * 30_482_612


def test_only_the_layers_fed_by_both_gpus_communicate():
    r = alexnet_split()
    sent = {k: v[1] for k, v in r.per_layer.items()}
    assert sent == {"conv1": 0, "conv2": 0, "conv3": 13 * 13 * 128, "conv4": 0, "conv5": 0,
                    "fc6": 6 * 6 * 128, "fc7": 2048, "fc8": 2048, "softmax": 500}
    # forward + backward, 128 images, 4 bytes: 2 x 128 x 4 x 30,836
    assert r.sent_bytes_per_gpu == 2 * 128 * 4 * (21632 + 4608 + 2048 + 2048 + 500) == 31_576_064
    # data parallelism allreduces the whole 61 M-parameter gradient: 2 (g-1)/g x 243.9 MB
    assert r.data_parallel_bytes_per_gpu == 60_965_224 * 4
    assert r.data_parallel_bytes_per_gpu > 7 * r.sent_bytes_per_gpu


def test_one_gpu_holds_everything_and_sends_nothing():
    r = alexnet_split(gpus=1, batch=1)
    assert r.params_per_gpu == 60_965_224 and r.sent_bytes_per_gpu == 0


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(gpus=0), ValueError, r"gpus=0"),
    (dict(gpus=3), ValueError, r"conv1: kernels=96 cannot be split evenly over gpus=3|"
                                r"cannot be split evenly over gpus=3"),
    (dict(batch=2.5), TypeError, r"batch must be an integer"),
    (dict(layers=[("conv1", 96, 363, 0)]), TypeError, r"layer must be"),
])
def test_bad_input_is_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        alexnet_split(**kwargs)


def test_a_custom_layer_list():
    r = alexnet_split([SplitLayer("a", 4, 10, 8)], gpus=2, batch=3, itemsize=2)
    assert r.params_per_gpu == 2 * 11 and r.sent_bytes_per_gpu == 2 * 3 * 2 * 4
    assert len(ALEXNET) == 9
