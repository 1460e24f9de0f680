"""Stage 1: Optuna (TPE via OptunaSearch) + ASHA on Ray Tune -> lr_table.parquet and a loadable study."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import optuna
import pyarrow.parquet as pq
import pytest

from loopscale.sweep._seams import COUNT_ENV, trained_counts
from loopscale.sweep.lr_search import PersistentASHA, run_tune_lr
from loopscale.sweep.lr_table import _smooth, read_lr_table
from loopscale.sweep.presets import PRESETS, preset_spec
from loopscale.sweep.spec import parse_spec


@pytest.fixture(scope="module")
def ray_local():
    from loopscale.cluster.connect import ray_session

    with ray_session(num_cpus=2, temp_dir="/tmp/lsray_sw") as info:
        yield info


def _spec(**tune):
    d = copy.deepcopy(PRESETS["smoke"])
    d.update(sizes=[16], r=[1, 2], lr="tune")
    d["tune"].update(tune_per_r=False, **tune)
    return parse_spec(d)


def test_lr_trial_tokens_round_to_the_nearest_step_then_up_per_milestone():
    """docs/cli.md's rule and example: tokens in the nearest whole number of steps, then up to whole steps per
    milestone, at least one per milestone (it had said "rounded up", and 300 tokens at batch 256 train 256)."""
    base = _spec(num_samples=2)
    assert base.training.batch_tokens == 256

    def steps(tokens: int, milestones: int) -> tuple[int, int]:
        return _spec(num_samples=2, tokens=tokens, num_milestones=milestones, grace_milestones=1).tuning_steps(16, 2)

    assert steps(300, 1) == (1, 1)  # 1.17 steps: the nearest is 1, 256 tokens
    assert steps(400, 1) == (2, 2)  # 1.56 steps: 2
    assert steps(5 * 256, 2) == (6, 3)  # 5 steps, up to 3 per milestone
    assert steps(256, 4) == (4, 1)  # at least one step per milestone


def test_studies_of_one_trial_are_refused_before_they_start(tmp_path):
    """`tune.num_samples: 1` with `lr: tune` "tuned" from one trial without a word (its LR a random draw, or the
    middle of lr_values). `tune-lr`, `run` and `run --dry-run` refuse it before anything is written or trained; a
    folder whose LR table exists still runs (nothing is tuned there)."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app
    from loopscale.sweep.spec import spec_to_yaml

    d = copy.deepcopy(PRESETS["smoke"])
    d.update(lr="tune")
    d["tune"].update(num_samples=1)
    spec = parse_spec(d)
    f = tmp_path / "one.yaml"
    f.write_text(spec_to_yaml(spec))
    want = "tune.num_samples 1 tries one LR per study: there is nothing to tune"
    for args in (["tune-lr", str(f), "--out", str(tmp_path / "a")], ["run", str(f), "--out", str(tmp_path / "b")],
                 ["run", str(f), "--out", str(tmp_path / "c"), "--dry-run"]):  # fmt: skip
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and want in " ".join(res.output.split()), (args, res.output)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b" / "tune_lr").exists()
    done = tmp_path / "done"  # an LR table there: the dry run plans the grid, no refusal
    done.mkdir()
    rows = [dict(size=s, r=r, tuned_r=r, N_unique=1000, N_usage=1000, lr_best=0.01, best_val_loss=3.2,
                 lr_smoothed=0.01, lr=0.01, n_trials=1, n_pruned=0, budget_tokens=1024, study_name="s",
                 storage="sqlite:///x") for s in spec.all_sizes() for r in spec.r]  # fmt: skip
    from loopscale.sweep.lr_table import _lr_table_schema
    from loopscale.sweep.store import to_table, write_table_atomic

    write_table_atomic(to_table(rows, _lr_table_schema()), done / "lr_table.parquet")
    res = CliRunner().invoke(app, ["run", str(f), "--out", str(done), "--dry-run"])
    assert res.exit_code == 0 and want not in res.output, res.output


def test_tune_lr_six_samples_with_asha_gives_table_and_study(ray_local, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(COUNT_ENV, "1")  # markers of completed trainings (loopscale.sweep._seams)
    spec = _spec(num_samples=6, max_concurrent=2, seed=3)
    table = run_tune_lr(spec, tmp_path)
    rows = pq.read_table(tmp_path / "lr_table.parquet").to_pylist()
    assert rows == table.to_pylist()
    assert [(r["size"], r["r"]) for r in rows] == [(16, 1), (16, 2)]  # tune_per_r false: one study, LR shared
    study = optuna.load_study(study_name=rows[0]["study_name"], storage=rows[0]["storage"])
    states = [t.state for t in study.trials]
    assert len(states) == 6 and optuna.trial.TrialState.RUNNING not in states
    assert states.count(optuna.trial.TrialState.PRUNED) >= 1  # ASHA stopped someone
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = min(complete, key=lambda t: t.value)
    assert rows[0]["lr"] == rows[1]["lr"] == best.params["lr"] and rows[0]["best_val_loss"] == best.value
    # a best LR at either end of the LRs tried is said (the optimum may lie beyond them), and only then
    from loopscale.sweep.lr_search import edge_of_tried

    edge = edge_of_tried(study, best.params["lr"])
    err = capsys.readouterr().err
    assert ("best LR at the edge of the LRs tried" in err) == (edge is not None)
    # its advice changes the spec, which this folder refuses: the line says where a changed spec tunes
    assert (f"(a changed spec tunes in a new --out folder: {tmp_path} keeps this spec)" in err) == (edge is not None)
    # what it said is recorded with the study's rows (the report and `status` read it there): one study, both r
    notes = [json.loads(row["notes"]) for row in rows]
    assert notes[0] == notes[1] and any("best LR at the edge" in n for n in notes[0]) == (edge is not None)
    assert all(spec.tune.lr_min <= t.params["lr"] <= spec.tune.lr_max for t in study.trials)
    for t in complete:  # every milestone 1..4 was recorded
        assert sorted(t.intermediate_values) == [1, 2, 3, 4]
    assert (tmp_path / "tune_lr" / "loss_vs_lr_size16.png").stat().st_size > 1000
    assert max(trained_counts(str(tmp_path / "tune_lr" / "ray")).values()) == 1
    # the table feeds the grid
    lr = read_lr_table(tmp_path / "lr_table.parquet")
    assert {c.lr for c in spec.cells(lr_table=lr)} == {best.params["lr"]}
    # finished studies are not rerun: no trial trains again and the study keeps its 6 trials
    trained = trained_counts(str(tmp_path / "tune_lr" / "ray"))
    again = run_tune_lr(spec, tmp_path, plot=False)
    assert again.to_pylist() == rows
    assert trained_counts(str(tmp_path / "tune_lr" / "ray")) == trained
    assert len(optuna.load_study(study_name=rows[0]["study_name"], storage=rows[0]["storage"]).trials) == 6


def test_the_lr_display_counts_the_trials_studies_held_before(tmp_path, monkeypatch):
    """tune-lr goes on with a study an earlier command stopped after 2 trials: the display starts with them (the
    mirror does not report them again), so the counts reach the total; other studies' trials are not counted."""
    from loopscale.cluster import connect
    from loopscale.sweep import console
    from loopscale.sweep.lr_search import LRSpace

    spec = _spec(num_samples=3)
    name = f"{spec.name}_size16_r2"  # tune_per_r false: one study, at the largest r
    db = f"sqlite:///{(tmp_path / 'tune_lr' / 'optuna.db').resolve()}"
    (tmp_path / "tune_lr").mkdir()
    dist = LRSpace({}, 1e-4, 1e-1, None).distribution()
    for study_name, trials in ((name, [(0.01, 3.2), (0.1, None)]), ("another_size16_r2", [(0.02, 3.0)])):
        study = optuna.create_study(study_name=study_name, storage=db)
        for lr, value in trials:
            state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.PRUNED
            study.add_trial(
                optuna.trial.create_trial(params={"lr": lr}, distributions={"lr": dist}, value=value, state=state)
            )
    views = []
    monkeypatch.setattr(console, "start_view", lambda v, start=console.start_view: views.append(v) or start(v))

    class _NoRay(Exception):
        pass

    def no_ray(*a, **k):
        raise _NoRay

    monkeypatch.setattr(connect, "ray_session", no_ray)
    with pytest.raises(_NoRay):
        run_tune_lr(spec, tmp_path, plot=False)
    (view,) = views
    assert view.states == {"COMPLETE": 1, "PRUNED": 1, "FAIL": 0} and view.best == {(16, 2): (3.2, 0.01)}
    assert (view.prior, view.total) == (2, 3)


class _T:
    def __init__(self, lr, tid):
        self.config, self.trial_id = {"lr": lr}, tid


def test_persistent_asha_matches_asha_and_survives_a_new_instance(tmp_path):
    """Rung cutoffs are ASHA's ((1 - 1/rf) quantile), and a new scheduler on the same state file returns the
    recorded decisions (Ray 2.60 does not save the scheduler with the experiment)."""
    path = str(tmp_path / "asha.json")

    def make():
        return PersistentASHA(
            path,
            time_attr="milestone",
            metric="val_loss",
            mode="min",
            max_t=8,
            grace_period=1,
            reduction_factor=2,
        )

    a = make()
    seq = [(0.01, 1, 3.0), (0.02, 1, 2.0), (0.03, 1, 4.0), (0.02, 2, 1.9), (0.01, 2, 2.5), (0.04, 1, 2.5)]
    got = [a.on_trial_result(None, _T(lr, str(lr)), {"milestone": m, "val_loss": v}) for lr, m, v in seq]
    # 0.03 at rung 1: worse than the median of {3.0, 2.0} -> STOP; 0.01 at rung 2 worse than 1.9 -> STOP;
    # 0.04 at rung 1: 2.5 vs median of {3.0, 2.0, 4.0} = 3.0 -> CONTINUE
    assert got == ["CONTINUE", "CONTINUE", "STOP", "CONTINUE", "STOP", "CONTINUE"]
    b = make()  # restored driver: same records, same answers, keyed by LR (new trial ids)
    assert b.on_trial_result(None, _T(0.03, "new-id"), {"milestone": 1, "val_loss": 4.0}) == "STOP"
    assert b.on_trial_result(None, _T(0.04, "x"), {"milestone": 8, "val_loss": 2.0}) == "STOP"  # max_t
    st = json.loads((tmp_path / "asha.json").read_text())
    assert st["history"]["0.02"] == {"1": 2.0, "2": 1.9}


def test_smoothing_fits_a_line_in_log_lr_log_n():
    rows = [dict(r=1, N_unique=n, lr_best=0.1 * n**-0.5, lr_smoothed=None) for n in (1e4, 4e4, 1.6e5)]
    rows[1]["lr_best"] *= 1.2  # noise on the middle point
    _smooth(rows)
    import math

    lg = [math.log(r["lr_smoothed"]) for r in rows]
    assert lg[1] - lg[0] == pytest.approx(lg[2] - lg[1], rel=1e-9)  # equally spaced in log N -> a line
    assert rows[0]["lr_smoothed"] != rows[0]["lr_best"]
    # by hand: three sizes equally spaced in log N, so the least-squares slope is that of the end points (-0.5)
    # and the middle point's noise, log 1.2, lifts the line by a third of it
    for row in rows:
        assert row["lr_smoothed"] == pytest.approx(0.1 * row["N_unique"] ** -0.5 * 1.2 ** (1 / 3), rel=1e-9)
    single = [dict(r=2, N_unique=1e4, lr_best=0.01, lr_smoothed=None)]
    _smooth(single)
    assert single[0]["lr_smoothed"] == 0.01


def _first_lrs(spec, size: int, r: int, tmp_path, n: int = 4) -> list[float]:
    """The first ``n`` LRs the study of (size, r) proposes (its own sampler, asked on an in-memory study)."""
    from loopscale.sweep.lr_search import study_plan

    plan = study_plan(spec, size, r, tmp_path, str(tmp_path / "ray"), experiment=f"x{size}_{r}")
    sampler = plan["tune_config"].search_alg._sampler
    study = optuna.create_study(sampler=sampler)
    dist = optuna.distributions.FloatDistribution(spec.tune.lr_min, spec.tune.lr_max, log=True)
    lrs = []
    for _ in range(n):
        t = study.ask({"lr": dist})
        lrs.append(t.params["lr"])
        study.tell(t, 1.0)
    return lrs


def test_each_study_draws_its_own_lrs_reproducibly(tmp_path):
    """One tune.seed, several studies: each (size, r) tries other LRs (one shared seed tried the same LRs at every
    size, so with a few samples every study chose among identical candidates); the same study draws the same LRs
    again, and another tune.seed draws others."""
    spec = _spec(num_samples=4, seed=3)
    spec2 = parse_spec({**spec.model_dump(mode="json"), "sizes": [16, 32]})
    a, b = _first_lrs(spec2, 16, 2, tmp_path), _first_lrs(spec2, 32, 2, tmp_path)
    assert not set(a) & set(b)
    assert _first_lrs(spec2, 16, 2, tmp_path) == a
    other = parse_spec({**spec2.model_dump(mode="json"), "tune": {**spec2.tune.model_dump(mode="json"), "seed": 4}})
    assert not set(_first_lrs(other, 16, 2, tmp_path)) & set(a)


def test_edge_of_tried_names_a_best_lr_at_either_end():
    from loopscale.sweep.lr_search import edge_of_tried

    study = optuna.create_study()
    dist = {"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)}
    for lr, loss in [(1e-3, 3.0), (1e-2, 2.5), (3e-2, 2.4)]:
        study.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=dist, value=loss))
    assert edge_of_tried(study, 3e-2) == "highest" and edge_of_tried(study, 1e-3) == "lowest"
    assert edge_of_tried(study, 1e-2) is None and edge_of_tried(study, None) is None
    two = optuna.create_study()
    for lr in (1e-3, 1e-2):
        two.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=dist, value=1.0))
    assert edge_of_tried(two, 1e-2) is None  # two LRs: every choice is an end, nothing to say


def test_edge_of_tried_counts_unhealthy_failed_trials_but_not_raised_ones():
    """LRs 3, 10, 30 where 10 and 30 failed as unhealthy (did not learn): 3 was chosen, the lowest tried, and no
    warning was given because failed trials did not count. An unhealthy trial bounds the LR from its side; one
    that raised (a crash) says nothing about its LR."""
    from loopscale.sweep.lr_search import edge_of_tried

    dist = {"lr": optuna.distributions.FloatDistribution(1e-4, 100.0, log=True)}
    fail = optuna.trial.TrialState.FAIL

    def study(kinds):
        st = optuna.create_study()
        st.add_trial(optuna.trial.create_trial(params={"lr": 3.0}, distributions=dist, value=4.77))
        for lr, kind in zip((10.0, 30.0), kinds, strict=True):
            st.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=dist, state=fail,
                                                   user_attrs={"fail_kind": kind}))  # fmt: skip
        return st

    assert edge_of_tried(study(["unhealthy", "unhealthy"]), 3.0) == "lowest"
    assert edge_of_tried(study(["error", "error"]), 3.0) is None  # one LR tried that says anything
    # diverged above the chosen LR: it is the highest healthy one, but not an edge of what was tried
    above = study(["unhealthy", "unhealthy"])
    above.add_trial(optuna.trial.create_trial(params={"lr": 1.0}, distributions=dist, value=4.9))
    assert edge_of_tried(above, 3.0) is None


def test_rejected_trials_are_named_with_their_lr_and_reason():
    """A study that chose an LR but rejected others (flat curve, diverged) said nothing of them on the console: they
    were only failed markers in lr_table.png. The note lists each by LR with its reason; a trial that raised is
    not a rejection of its LR and is left out, and a study without rejections gives no note."""
    from loopscale.sweep.lr_search import rejected_note, rejected_trials

    dist = {"lr": optuna.distributions.FloatDistribution(1e-4, 100.0, log=True)}
    fail = optuna.trial.TrialState.FAIL
    st = optuna.create_study()
    st.add_trial(optuna.trial.create_trial(params={"lr": 3.0}, distributions=dist, value=4.77))
    for lr, kind, why in [(30.0, "unhealthy", "diverged at step 3 (NaN/inf or exploding training loss)"),
                          (10.0, "unhealthy", "did not learn: validation loss 3.3 at the end is not below 3.3 at "
                                              "the first milestone (a flat curve)"),
                          (1.0, "error", "RuntimeError: boom")]:  # fmt: skip
        st.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=dist, state=fail,
                                               user_attrs={"fail_kind": kind, "fail_reason": why}))  # fmt: skip
    assert [lr for lr, _ in rejected_trials(st)] == [10.0, 30.0]
    note = rejected_note(16, 2, st)
    assert note.startswith("size 16, r 2: 2 of 4 trials rejected: LR 10: did not learn")
    assert "; LR 30: diverged at step 3" in note and "boom" not in note
    # LR 3 is the only healthy trial: the choice compared nothing, and the note says so (a new user's study chose
    # its one healthy LR over a rejected one whose end loss was lower, without a word)
    assert note.endswith("; the chosen LR is the study's only healthy trial, so no LR was compared with it: raise "
                         "tune.num_samples, or narrow tune.lr_min / lr_max toward it")  # fmt: skip
    st.add_trial(optuna.trial.create_trial(params={"lr": 2.0}, distributions=dist, value=4.8))
    assert "only healthy trial" not in rejected_note(16, 2, st)
    ok = optuna.create_study()
    ok.add_trial(optuna.trial.create_trial(params={"lr": 3.0}, distributions=dist, value=4.77))
    assert rejected_note(16, 2, ok) is None
    # a curve that rose after its first milestone yet ended below the chosen trial (a new user's study chose 0.02 at
    # 3.342 over 0.05 at 3.203 and said only "did not learn"): named, with the LRs between the two to try
    rose = optuna.create_study()
    rose.add_trial(optuna.trial.create_trial(params={"lr": 0.02}, distributions=dist, value=3.342,
                                             intermediate_values={1: 3.5, 2: 3.342}))  # fmt: skip
    rose.add_trial(optuna.trial.create_trial(params={"lr": 0.005}, distributions=dist, value=3.6))
    rose.add_trial(optuna.trial.create_trial(
        params={"lr": 0.05}, distributions=dist, state=fail, intermediate_values={1: 3.178, 2: 3.2029},
        user_attrs={"fail_kind": "unhealthy", "fail_reason": "did not learn: ... (a rising curve: ...)"}))  # fmt: skip
    tune_values = SimpleNamespace(lr_values=[0.005, 0.02, 0.05])
    assert rejected_note(16, 1, rose, tune_values).endswith(
        "; LR 0.05 ended below the chosen LR 0.02 (val 3.2029 against 3.3420) and was rejected for the reason above, "
        "not for its loss: the best stable LR may lie between 0.02 and 0.05; add LRs between them to tune.lr_values")
    assert rejected_note(16, 1, rose).endswith("; more LRs between them (tune.num_samples) would tell")
    listed = SimpleNamespace(lr_values=[0.005, 0.02, 0.03, 0.05])  # 0.03 listed, not tried (num_samples 3 of 4)
    assert rejected_note(16, 1, rose, listed).endswith(
        "; raise tune.num_samples to try the values of tune.lr_values between them")
    st.add_trial(optuna.trial.create_trial(  # a rejected trial above the chosen one's loss: no such clause
        params={"lr": 20.0}, distributions=dist, state=fail, intermediate_values={1: 4.7, 2: 4.9},
        user_attrs={"fail_kind": "unhealthy", "fail_reason": "did not learn: (a rising curve)"}))  # fmt: skip
    assert "ended below the chosen LR" not in rejected_note(16, 2, st)


def test_edge_advice_names_the_setting_that_would_tell():
    """The hint said 'widen tune.lr_min / tune.lr_max' for a best LR of 0.0212 far inside [0.001, 0.1]."""
    from loopscale.sweep.lr_search import edge_advice

    tune = preset_spec("smoke").tune  # lr_min 1e-3, lr_max 1e-1
    assert edge_advice("highest", 0.0212, tune) == "raise tune.num_samples (tune.lr_max is 0.1)"
    assert edge_advice("highest", 0.08, tune) == "widen tune.lr_max (0.1)"
    assert edge_advice("lowest", 0.0012, tune) == "widen tune.lr_min (0.001)"
    assert edge_advice("lowest", 0.01, tune) == "raise tune.num_samples (tune.lr_min is 0.001)"
    listed = tune.model_copy(update={"lr_values": [0.01, 0.02, 0.04]})
    assert edge_advice("highest", 0.04, listed) == "add larger values to tune.lr_values"


def test_tuning_that_costs_more_than_the_grid_is_said_before_it_starts(tmp_path, monkeypatch, capfd):
    """`run --dry-run` warned that LR tuning may cost 1,420x the grid's training FLOPs, while `tune-lr` and `run`
    themselves started that tuning saying nothing: the warning now comes as the tuning starts (before Ray), for what
    is left of it, and not when the folder holds its LR table."""
    from typer.testing import CliRunner

    import loopscale.cluster.connect as connect
    from loopscale.sweep.cli import app
    from loopscale.sweep.run import lr_cost_left_warning, plan
    from loopscale.sweep.spec import spec_to_yaml

    spec = _spec(num_samples=6, tokens=1 << 17)  # trials of 131,072 tokens against a grid of 2,048-4,096-token runs
    want = plan(spec, data=False)["lr_warning"]
    assert want and want.startswith("LR tuning may cost up to") and lr_cost_left_warning(spec, tmp_path) == want
    assert lr_cost_left_warning(_spec(num_samples=2, tokens=256), tmp_path) is None  # cheaper than the grid

    class Stop(Exception):
        pass

    def no_ray(*a, **k):
        raise Stop("Ray not started in this test")

    monkeypatch.setattr(connect, "ray_session", no_ray)
    (tmp_path / "s.yaml").write_text(spec_to_yaml(spec))
    res = CliRunner().invoke(app, ["tune-lr", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")])
    assert isinstance(res.exception, Stop), res.output
    err = capfd.readouterr().err  # the console session writes to the process's stderr
    assert f"warning: {want}" in " ".join(err.split()), err
    assert "ASHA first compares" not in err  # trials of 128 steps a milestone
    # ASHA comparing trials after 2 steps (2,048 tokens over 4 milestones at batch 256) is said there too
    from loopscale.sweep.lr_search import early_rung_warning

    early = _spec(num_samples=6, tokens=2048)
    (tmp_path / "e.yaml").write_text(spec_to_yaml(early))
    res = CliRunner().invoke(app, ["tune-lr", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "e")])
    assert isinstance(res.exception, Stop), res.output
    said = early_rung_warning(early)
    assert "after 2 steps" in said and f"warning: {said}" in " ".join(capfd.readouterr().err.split())
    # with the LR table there, nothing is left to tune: no warning
    from loopscale.sweep.lr_table import _lr_table_schema

    schema = _lr_table_schema()
    rows = [{**dict.fromkeys(schema.names), "size": 16, "r": r, "lr": 0.01} for r in (1, 2)]
    pq.write_table(__import__("pyarrow").Table.from_pylist(rows, schema=schema), tmp_path / "o" / "lr_table.parquet")
    assert lr_cost_left_warning(spec, tmp_path / "o") is None


def test_run_tune_lr_takes_quiet_as_run_sweep_does(tmp_path, monkeypatch):
    """The README says `quiet=True` turns off the progress display of `run_sweep` and `run_tune_lr`; run_tune_lr
    raised "unexpected keyword argument 'quiet'". Now it starts no LR display when quiet, and one when not."""
    import loopscale.cluster.connect as connect
    from loopscale.sweep import console

    seen = []

    def no_ray(*a, **k):
        seen.append(type(console._VIEW).__name__ if console._VIEW is not None else None)
        raise RuntimeError("Ray not started in this test")

    monkeypatch.setattr(connect, "ray_session", no_ray)
    for quiet, out in ((True, "q"), (False, "v")):
        with pytest.raises(RuntimeError, match="Ray not started"):
            run_tune_lr(_spec(num_samples=2), tmp_path / out, quiet=quiet)
        console.end_view()
    assert seen == [None, "LRView"]


def test_a_study_without_a_healthy_trial_counts_pruned_trials_apart():
    """A study whose 2 trials were one did_not_learn and one pruned by ASHA was reported "all 2 trials diverged or
    did not learn ... (1 of 2: pruned)": a pruned trial did neither. Pruned trials are now counted apart."""
    from loopscale.sweep.lr_search import _no_healthy_trial
    from loopscale.sweep.presets import PRESETS
    from loopscale.sweep.spec import parse_spec

    d = copy.deepcopy(PRESETS["smoke"])
    d.update(lr="tune")
    d["tune"].update(lr_min=3, lr_max=30)
    spec = parse_spec(d)
    mixed = str(_no_healthy_trial(spec, {(16, 1): ("unhealthy", ["did not learn: flat curve", "pruned"])}, 1, 2))
    assert mixed.startswith("size 16, r 1: no trial of 2 learned at LR in [3, 30]: 1 diverged or did not learn "
                            "(1 of 1: did not learn: flat curve) and 1 was stopped early by ASHA (pruned); no LR was "
                            "chosen"), mixed  # fmt: skip
    alone = str(_no_healthy_trial(spec, {(16, 1): ("unhealthy", ["diverged at step 3"] * 2)}, 1, 2))
    assert alone.startswith("size 16, r 1: all 2 trials diverged or did not learn at LR in [3, 30] (2 of 2: "
                            "diverged at step 3)"), alone  # fmt: skip
    pruned = str(_no_healthy_trial(spec, {(16, 1): ("unhealthy", ["pruned"] * 3)}, 1, 3))
    assert pruned.startswith("size 16, r 1: all 3 trials at LR in [3, 30] were stopped early by ASHA (pruned)")
