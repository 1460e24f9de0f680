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


def test_a_sigterm_that_also_stopped_the_ray_head_ends_the_driver_with_its_message(monkeypatch):
    """A SIGTERM to the whole process group (SLURM's scancel, ``kill -- -PGID``) stops the Ray head the driver
    started too; every later call to it blocked, and 60 s on Ray's core ended the driver with exit 1 and no
    message. Once the head is seen gone (and not by the driver's own ray.shutdown) the driver says so and exits
    143; with the head alive, or while the session shuts it down, the watch stands down."""
    import io

    from loopscale.cluster import connect
    from loopscale.sweep import console

    exits: list[int] = []

    def fake_exit(code):
        exits.append(code)

    buf = io.StringIO()
    monkeypatch.setattr(connect.os, "_exit", fake_exit)
    monkeypatch.setattr(connect, "say_stop", console.Console(buf, interactive=False).say)
    monkeypatch.setattr(connect, "_ray_head_lost", lambda: True)
    monkeypatch.setattr(connect, "_SHUTTING_DOWN", [])
    connect._exit_if_ray_head_lost(watch_s=5)
    assert exits == [143]
    assert buf.getvalue().startswith("interrupted (SIGTERM): Ray's own processes were stopped by the same signal")
    assert "--resume" in buf.getvalue()
    exits.clear()
    monkeypatch.setattr(connect, "_SHUTTING_DOWN", [True])  # the session's own ray.shutdown stops the head
    connect._exit_if_ray_head_lost(watch_s=3)
    monkeypatch.setattr(connect, "_SHUTTING_DOWN", [])
    monkeypatch.setattr(connect, "_ray_head_lost", lambda: False)  # a SIGTERM to the driver alone
    connect._exit_if_ray_head_lost(watch_s=2)
    assert exits == []
