"""The chapter-1 panel, driven headlessly: controls -> experiment call -> drawing."""

import inspect

import numpy as np
import pytest

from coursekit.data import make_classification
from coursekit.nn.experiment import train_digits
from coursekit.nn import MLP, train
from coursekit.widgets.backprop import BackpropPanel, LivePlot


def test_run_button_calls_the_experiment_with_the_controls():
    calls = []

    def experiment(callback, **kwargs):
        calls.append(kwargs)
        return train_digits(**kwargs, callback=callback, data=make_classification(200, 64, 10, seed=0))

    panel = BackpropPanel(experiment, seed=3)
    panel.hidden.value = 16
    panel.lr.value = 0.05
    panel.batch_size.value = 64
    panel.activation.value = "tanh"
    panel.epochs.value = 2
    redraws = []
    panel.plot.observe(redraws.append, "value")
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    assert calls == [{"hidden": 16, "lr": pytest.approx(0.05), "batch_size": 64, "activation": "tanh",
                      "epochs": 2, "seed": 3}]
    assert panel.result.history.epochs == 2
    assert f"{panel.result.test_accuracy:.1%}" in panel.status.value
    assert panel.plot.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert 1 <= len(redraws) <= 3  # live redraws (throttled) plus the final one
    assert not panel.run_button.disabled


def test_panel_result_equals_a_direct_call():
    panel = BackpropPanel()
    panel.epochs.value = 3
    result = panel.run()
    direct = train_digits(epochs=3)
    np.testing.assert_array_equal(result.history.step_loss, direct.history.step_loss)


def test_a_diverging_run_says_so_and_in_which_epoch():
    panel = BackpropPanel()
    panel.lr.value = 10**0.5  # the slider's top: lr 3.16 overflows within the first epochs
    panel.epochs.value = 3
    with np.errstate(all="ignore"):
        result = panel.run()
    epoch = result.history.diverged_at
    assert epoch is not None and 1 <= epoch <= 3
    assert panel.status.value.startswith(f"diverged in epoch {epoch}: the loss overflowed")
    panel.lr.value = 0.1
    panel.run()
    assert panel.result.history.diverged_at is None and panel.status.value.startswith("test accuracy")


def test_diverged_at_counts_epochs_from_one():
    history = train(MLP([4, 3, 2], seed=0), np.zeros((8, 4)), np.zeros(8, int), epochs=2, batch_size=4, lr=0.1)
    assert history.diverged_at is None
    poisoned = type(history)(**{**history.__dict__, "step_loss": np.array([1.0, 1.0, 1.0, np.nan])})
    assert poisoned.diverged_at == 2


def test_errors_from_the_experiment_show_in_the_status():
    def failing(**kwargs):
        raise ValueError("hidden=4 is too small for this demo")

    panel = BackpropPanel(failing)
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    assert panel.status.value == "error: hidden=4 is too small for this demo"
    assert panel.result is None and not panel.run_button.disabled


def test_controls_offer_every_activation_and_the_default_settings():
    panel = BackpropPanel()
    assert set(panel.activation.options) == {"relu", "sigmoid", "tanh"}
    defaults = inspect.signature(train_digits).parameters
    for name, value in panel.settings().items():
        assert value == pytest.approx(defaults[name].default), name


def test_live_plot_is_a_train_callback():
    data = make_classification(100, 5, 2, seed=1)
    live = LivePlot("demo", min_interval=0)
    draws = []
    live.observe(draws.append, "value")
    train(MLP([5, 4, 2]), data.X_train, data.y_train, epochs=2, callback=live)
    assert live.value[:8] == b"\x89PNG\r\n\x1a\n" and len(draws) == 2
    throttled = LivePlot(min_interval=3600)
    h = train(MLP([5, 4, 2]), data.X_train, data.y_train, epochs=3, callback=throttled)
    first = throttled.value
    assert first  # the first call always draws
    throttled(h)
    assert throttled.value is first  # too soon: skipped
    throttled(h, force=True)
    assert throttled.value != first


def test_the_batch_slider_spans_sgd_to_full_batch_gradient_descent(digits_f64):
    from coursekit.widgets.backprop import DIGITS_TRAIN_ROWS

    panel = BackpropPanel()
    values = [value for _, value in panel.batch_size.options]
    assert values[0] == 1  # SGD: one example per update
    assert values[-1] == DIGITS_TRAIN_ROWS == len(digits_f64.X_train)  # one update per epoch
    calls = []
    panel.experiment = lambda callback, **kwargs: calls.append(kwargs["batch_size"])
    panel.batch_size.value = values[-1]
    panel.run()
    assert calls == [DIGITS_TRAIN_ROWS]
