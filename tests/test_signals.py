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
