"""Ctrl-C after a Ray Tune experiment: Tune leaves its own SIGINT handler installed after a normal end (it restores
the previous one only when a signal arrives), which swallowed the next Ctrl-C, e.g. during `loopscale run`'s fit."""

from __future__ import annotations

import signal

import pytest

from loopscale.sweep.grid import fit_tuner


def test_fit_tuner_leaves_the_sigint_handler_as_it_was(tmp_path):
    from ray import tune

    from loopscale.cluster.connect import ray_session

    def mine(sig, frame):
        raise KeyboardInterrupt

    def _trainable(config):  # nested: pickled by value (workers cannot import this test module)
        tune.report({"x": 1.0})

    before = signal.signal(signal.SIGINT, mine)
    try:
        with ray_session(num_cpus=1):
            tuner = tune.Tuner(_trainable, run_config=tune.RunConfig(storage_path=str(tmp_path), name="a"))
            grid = fit_tuner(tuner)
            assert not grid.errors
            assert signal.getsignal(signal.SIGINT) is mine
            # what Tune does on its own (the cause): its handler stays after a normal end
            tune.Tuner(_trainable, run_config=tune.RunConfig(storage_path=str(tmp_path), name="b")).fit()
            assert signal.getsignal(signal.SIGINT) is not mine, "Tune now restores the handler itself"
        signal.signal(signal.SIGINT, mine)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_tune_caught_is_reported_even_when_every_trial_finished(tmp_path):
    """The trial ends by sending the driver SIGINT as its last act: Tune catches it and ends the run with no
    unfinished trial, so only ``stopped_by_signal`` says a stop was asked (tune-lr went on to its next study and
    exited 0). A run without a signal says False, and the handler is ours again in both cases."""
    import os

    from ray import tune

    from loopscale.cluster.connect import ray_session

    def mine(sig, frame):
        raise KeyboardInterrupt

    def _trainable(config):
        tune.report({"x": 1.0})
        if config["kill"]:
            os.kill(config["driver"], signal.SIGINT)

    before = signal.signal(signal.SIGINT, mine)
    try:
        with ray_session(num_cpus=1):
            for kill in (False, True):
                tuner = tune.Tuner(_trainable, param_space={"kill": kill, "driver": os.getpid()},
                                   run_config=tune.RunConfig(storage_path=str(tmp_path), name=f"k{kill}"))
                grid = fit_tuner(tuner)
                assert grid.stopped_by_signal is kill
                assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)
