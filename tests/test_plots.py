"""Figures read as a user reads them: y-ranges set by the data (not by an extrapolated law), a non-negative profile
axis, and tick labels that do not overlap. Each test inspects the matplotlib Figure the plotting code builds."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from loopscale.fit.laws import make_law  # noqa: E402

# the joint-law point estimate of `loopscale run --preset smoke` (alpha on its bound): extrapolated to a fifth of
# the smallest budget it reaches ~60 nats, while the runs lie between 3.4 and 4.6 nats/token
SMOKE_PARAMS = {"E": 3.235, "A": 7.67e10, "alpha": 2.5, "B": 9.43e7, "beta": 2.431, "phi": 0.9077}


def _smoke_runs() -> pd.DataFrame:
    """The 16 runs of the smoke preset (r 1, 2, 4, 8 x widths 16, 32 x D 2048, 4096)."""
    rows = []
    loss = {(16, 2048): 4.55, (32, 2048): 4.09, (16, 4096): 3.84, (32, 4096): 3.42}
    for (d, D), L in loss.items():
        for i, r in enumerate((1, 2, 4, 8)):
            n_once, n_rec = ((48, 31040), (6256, 12928), (6256, 6720), (6256, 3616))[i]
            if d == 32:
                n_once, n_rec = ((96, 123520), (24800, 51456), (24800, 26752), (24800, 14400))[i]
            F = 6.0 * (n_once + r * n_rec) * (4.4 if d == 16 else 2.4)
            rows.append(dict(status="ok", r=r, d_model=d, D=D, C=F * D, N_once=n_once, N_rec=n_rec,
                             N_unique=n_once + n_rec, final_val_loss=L + 0.01 * i, loss=L + 0.01 * i))  # fmt: skip
    return pd.DataFrame(rows)


def _visible_labels(axis) -> list:
    """(label, text) of the tick labels drawn inside the axis's view interval, major and minor."""
    lo, hi = sorted(axis.get_view_interval())
    out = []
    for locs, labels in ((axis.get_majorticklocs(), axis.get_majorticklabels()),
                         (axis.get_minorticklocs(), axis.get_minorticklabels())):  # fmt: skip
        for loc, lab in zip(locs, labels, strict=False):
            if lo * (1 - 1e-9) <= loc <= hi * (1 + 1e-9) and lab.get_visible() and lab.get_text():
                out.append(lab)
    return out


def _overlapping_xlabels(fig) -> list[tuple[str, str]]:
    """Pairs of x tick labels (per axes) whose drawn boxes overlap."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    bad = []
    for ax in fig.axes:
        labs = sorted(_visible_labels(ax.xaxis), key=lambda t: t.get_window_extent(r).x0)
        boxes = [t.get_window_extent(r) for t in labs]
        for (a, ba), (b, bb) in zip(zip(labs, boxes, strict=True), list(zip(labs, boxes, strict=True))[1:],
                                    strict=False):  # fmt: skip
            if ba.x1 > bb.x0:
                bad.append((a.get_text(), b.get_text()))
    return bad


# --- loss vs compute: the y-range is the data's -----------------------------------------------------------------


def test_loss_vs_compute_ylim_is_set_by_the_data_and_curves_are_clipped():
    from loopscale.fit.run_report import loss_vs_compute_figure

    runs = _smoke_runs()
    fig = loss_vs_compute_figure(runs, {"variants": {"baseline": {"joint": {"params": SMOKE_PARAMS}}}})
    try:
        y = runs["final_val_loss"].to_numpy(float)
        span = y.max() - y.min()
        for ax in fig.axes:
            lo, hi = ax.get_ylim()
            assert lo < y.min() and hi > y.max()  # every point is inside, with a margin
            assert lo > y.min() - 0.3 * span and hi < y.max() + 0.3 * span  # not blown up by the curves
            curves = np.concatenate([ln.get_ydata() for ln in ax.get_lines()])
            # the law does reach far above: it is clipped, it does not set the range
            assert curves.max() > 2 * hi
        assert not _overlapping_xlabels(fig)
    finally:
        plt.close(fig)


def test_loss_vs_compute_draws_one_curve_per_model_of_a_ladder():
    """A unique-depth ladder (plain r = 1 models of several depths at one width, the `cpu` preset's) gets one law
    curve per depth, each through its own model's prediction: one curve per width was drawn, for whichever depth
    came first, so the r = 1 panel showed a line that belonged to one of five models."""
    from loopscale.fit.run_report import loss_vs_compute_figure

    params = {"E": 1.5, "A": 3.0, "alpha": 0.2, "B": 1e5, "beta": 1.0, "phi": -0.4}
    rows = []
    for layers in (4, 2, 10):  # the first row is not the deepest or the shallowest
        n = 3100.0 * layers
        for seed in range(2):
            rows.append(dict(status="ok", r=1, d_model=16, D=1e6, C=6 * n * 1e6, N_once=48.0, N_rec=n - 48,
                             final_val_loss=2.2 - 0.03 * layers + 0.001 * seed))  # fmt: skip
    rows.append(dict(status="ok", r=2, d_model=16, D=1e6, C=6 * 2e4 * 1e6, N_once=6000.0, N_rec=6600.0,
                     final_val_loss=1.95))  # fmt: skip
    runs = pd.DataFrame(rows)
    fig = loss_vs_compute_figure(runs, {"variants": {"baseline": {"joint": {"params": params}}}})
    try:
        ax = fig.axes[0]
        lines = ax.get_lines()
        assert len(lines) == 3
        law = make_law("joint")
        for layers in (2, 4, 10):
            m = runs[(runs["r"] == 1) & (runs["N_rec"] == 3100.0 * layers - 48)]
            C = float(m["C"].iloc[0])
            want = float(law.predict(params, {"N_once": np.array([48.0]), "N_rec": np.array([m["N_rec"].iloc[0]]),
                                              "r": np.array([1.0]), "D": np.array([1e6])})[0])  # fmt: skip
            got = [float(np.interp(np.log(C), np.log(ln.get_xdata()), ln.get_ydata())) for ln in lines]
            assert min(abs(g - want) for g in got) < 1e-3, (layers, want, got)
    finally:
        plt.close(fig)


def test_loss_vs_compute_marks_each_variant_and_draws_its_own_law():
    """With variants (trunc_bptt, hyperconnect) every run was drawn in its width's colour and one marker, and every
    model's curve with the baseline's law: the figure could not tell a variant's runs apart and its extra curve
    had no label. Each variant now has its marker and line style in the legend, and its curves its own law."""
    from loopscale.fit.run_report import loss_vs_compute_figure

    base = {"E": 1.5, "A": 3.0, "alpha": 0.2, "B": 1e5, "beta": 1.0, "phi": 0.5}
    other = {**base, "phi": -0.5}
    rows = [dict(status="ok", variant="baseline", r=1, d_model=16, D=1e6, C=6e10, N_once=1e4, N_rec=0.0,
                 final_val_loss=2.0)]  # fmt: skip
    for v, loss in (("baseline", 1.9), ("trunc_bptt", 1.95)):
        rows.append(dict(status="ok", variant=v, r=2, d_model=16, D=1e6, C=9e10, N_once=4e3, N_rec=6e3,
                         final_val_loss=loss))  # fmt: skip
    runs = pd.DataFrame(rows)
    ana = {"variants": {"baseline": {"joint": {"params": base}}, "trunc_bptt": {"joint": {"params": other}}}}
    fig = loss_vs_compute_figure(runs, ana)
    try:
        ax = fig.axes[1]  # r = 2
        assert len({c.get_paths()[0].vertices.tobytes() for c in ax.collections}) == 2  # two markers
        law = make_law("joint")
        cols = {"N_once": np.array([4e3]), "N_rec": np.array([6e3]), "r": np.array([2.0]), "D": np.array([1e6])}
        got = sorted(float(np.interp(np.log(9e10), np.log(ln.get_xdata()), ln.get_ydata())) for ln in ax.get_lines())
        want = sorted(float(law.predict(p, cols)[0]) for p in (base, other))
        assert np.allclose(got, want, atol=1e-6) and abs(want[0] - want[1]) > 1e-3
        assert [t.get_text() for t in fig.axes[-1].get_legend().get_texts()] == ["d=16", "baseline", "trunc_bptt"]
    finally:
        plt.close(fig)


def test_loss_vs_compute_without_compute_column_draws_nothing():
    from loopscale.fit.run_report import loss_vs_compute_figure, plot_loss_vs_compute

    runs = _smoke_runs().drop(columns="C")
    assert loss_vs_compute_figure(runs, {}) is None
    assert plot_loss_vs_compute(runs, {}, "/nonexistent/never_written.png") is None


def test_data_ylim_reach_bounds_how_far_curves_widen_the_range():
    from loopscale.fit.plots import data_ylim

    fig, ax = plt.subplots()
    try:
        assert data_ylim(ax, [3.0, 4.0]) == pytest.approx((2.9, 4.1))
        assert data_ylim(ax, [3.0, 4.0], curves=[1.0, 60.0], reach=0.5) == pytest.approx((2.3, 4.7))
        assert data_ylim(ax, [3.0, 4.0], curves=[3.5, 4.2], reach=0.5) == pytest.approx((2.88, 4.32))
        assert ax.get_ylim() == pytest.approx((2.88, 4.32))
        lo, hi = data_ylim(ax, [2.0, 2.0])  # one value: a range around it, not a zero-height axis
        assert lo < 2.0 < hi
    finally:
        plt.close(fig)


# --- fit curves: readable N ticks, y-range not set by the extrapolated arms ---------------------------------------


def test_fit_curves_labels_do_not_overlap_and_ylim_follows_the_data():
    from loopscale.fit.plots import fit_curves_figure

    runs = _smoke_runs()
    fit = SimpleNamespace(params=SMOKE_PARAMS, law="joint", r2=0.99, law_object=lambda: make_law("joint"))
    fig = fit_curves_figure(fit, runs)
    try:
        assert not _overlapping_xlabels(fig)
        y = runs["loss"].to_numpy(float)
        span = y.max() - y.min()
        for ax in fig.axes:
            assert len(_visible_labels(ax.xaxis)) >= 2  # still labelled
            lo, hi = ax.get_ylim()
            assert lo < y.min() and hi > y.max()
            assert hi - lo <= 2.2 * span  # curves widen it by at most half the span each side, plus margins
    finally:
        plt.close(fig)


def test_fit_curves_every_panel_names_its_own_budgets():
    """Each r panel's legend names the C of its own curves. There was one legend, in the last panel, so on a
    token-budget grid (C differs between r: the smoke preset's r = 1 runs start at C = 5.6e8, r = 8's at 6.1e8) or
    a ladder (five C at r = 1, one at r = 8) the other panels' colours were explained by r = 8's budgets."""
    from loopscale.fit.plots import fit_curves_figure

    runs = _smoke_runs()
    fit = SimpleNamespace(params=SMOKE_PARAMS, law="joint", r2=0.99, law_object=lambda: make_law("joint"))
    fig = fit_curves_figure(fit, runs)
    try:
        for ax, r in zip(fig.axes, (1, 2, 4, 8), strict=True):
            assert ax.get_legend() is not None, r
            labels = [t.get_text() for t in ax.get_legend().get_texts()]
            assert labels == [f"C={c:.2g}" for c in sorted(runs.loc[runs["r"] == r, "C"])], (r, labels)
    finally:
        plt.close(fig)


def _curves(ax) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {ln.get_label(): (ln.get_xdata(), ln.get_ydata()) for ln in ax.get_lines()}


def test_fit_curves_of_a_table_without_c_are_drawn_at_each_token_budget():
    """A table with no C column (an outside token-budget table) drew points only, with nothing said. Each r panel
    now draws the law at each of its D, values equal to the law's own prediction there."""
    from loopscale.fit.plots import fit_curves_figure

    runs = _smoke_runs().drop(columns="C")
    law = make_law("joint")
    fit = SimpleNamespace(params=SMOKE_PARAMS, law="joint", r2=0.99, law_object=lambda: law)
    fig = fit_curves_figure(fit, runs)
    try:
        for ax, r in zip(fig.axes, (1, 2, 4, 8), strict=True):
            curves = _curves(ax)
            assert sorted(curves) == ["D=2e+03", "D=4.1e+03"], (r, sorted(curves))
            ns, ys = curves["D=4.1e+03"]
            m = runs["r"] == r
            f = float((runs.loc[m, "N_once"] / runs.loc[m, "N_unique"]).median()) if r > 1 else 1.0
            want = law.predict(SMOKE_PARAMS, {"N_once": f * ns, "N_rec": (1 - f) * ns, "r": np.full(ns.size, r),
                                               "D": np.full(ns.size, 4096.0)})  # fmt: skip
            assert ys == pytest.approx(np.asarray(want))
        assert "points only" not in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_fit_curves_use_the_budget_column_for_c_and_say_when_they_draw_none():
    """An iso-FLOP table with ``budget`` (C in FLOPs) but no ``C``: curves per budget, named C=budget. With neither
    and many distinct D per r: points only, and the title says why."""
    from loopscale.fit.derived import FLOP_BUDGETS_MAX
    from loopscale.fit.plots import MAX_D_CURVES, fit_curves_figure

    runs = _smoke_runs()
    fit = SimpleNamespace(params=SMOKE_PARAMS, law="joint", r2=0.99, law_object=lambda: make_law("joint"))
    iso = runs.assign(budget=np.where(runs["D"] == 2048, 5e8, 1e9)).drop(columns="C")
    fig = fit_curves_figure(fit, iso)
    try:
        assert sorted(_curves(fig.axes[0])) == ["C=1e+09", "C=5e+08"]
    finally:
        plt.close(fig)
    many = pd.concat([runs.assign(D=runs["D"] * (1 + k / 10)) for k in range(MAX_D_CURVES)]).drop(columns="C")
    fig = fit_curves_figure(fit, many)
    try:
        assert all(not ax.get_lines() for ax in fig.axes)
        assert f"points only: no C column, no budget column, and more than {MAX_D_CURVES} distinct D per r" in (
            " ".join(fig._suptitle.get_text().split())
        )
    finally:
        plt.close(fig)
    # a C per run (e.g. C = 6 N D of an outside table) is a C column, said so (it said "no C or budget column")
    per_run = many.assign(C=6 * (many["N_once"] + many["N_rec"]) * many["D"] * (1 + np.arange(len(many)) / 1e3))
    fig = fit_curves_figure(fit, per_run)
    try:
        title = " ".join(fig._suptitle.get_text().split())
        assert f"points only: C takes more than {FLOP_BUDGETS_MAX} budgets per r, no budget column, and more" in title
        assert max(len(line) for line in fig._suptitle.get_text().splitlines()) <= 45 * len(fig.axes)
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    "lo,hi",
    [(2e4, 2e5), (1.3e4, 6.1e4), (8.1e3, 1.2e4), (3.7e8, 6.2e9), (1e-4, 1e-1), (1e-3, 1e-1), (2.2e-3, 4.7e-2),
     (1e3, 1e12)],
)  # fmt: skip
def test_log_ticks_gives_two_to_five_labels_that_do_not_overlap(lo, hi):
    from loopscale.fit.plots import log_ticks

    fig, ax = plt.subplots(figsize=(3.4, 3))
    try:
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ticks = log_ticks(ax.xaxis)
        assert 2 <= len(ticks) <= 5 and all(lo * 0.999 <= t <= hi * 1.001 for t in ticks)
        assert not _overlapping_xlabels(fig)
    finally:
        plt.close(fig)


def test_lr_plot_labels_do_not_overlap():
    from loopscale.sweep.lr_table import lr_figure

    lrs = np.geomspace(1.3e-3, 8e-2, 8)  # less than two decades: matplotlib labelled every minor tick
    series = {
        1: [(x, 4 + (np.log10(x) + 2) ** 2) for x in lrs],
        2: [(x, 4.1 + (np.log10(x) + 2.2) ** 2) for x in lrs],
    }
    fig = lr_figure(16, series)
    try:
        assert not _overlapping_xlabels(fig)
        assert len(_visible_labels(fig.axes[0].xaxis)) >= 2
        assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["r=1", "r=2"]
    finally:
        plt.close(fig)


def test_lr_plot_draws_stopped_trials_off_the_line():
    """A pruned trial's loss is from an earlier milestone: it is a hollow marker, not a point of r's line."""
    from loopscale.sweep.lr_table import lr_figure

    series = {1: [(1e-3, 4.0, True), (3e-3, 3.5, True), (1e-2, 3.6, True), (3e-2, 5.2, False)]}
    fig = lr_figure(16, series)
    try:
        ax = fig.axes[0]
        line = next(ln for ln in ax.get_lines() if ln.get_label() == "r=1")
        assert list(line.get_xdata()) == [1e-3, 3e-3, 1e-2]  # the pruned LR is not on the line
        hollow = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "none" and len(ln.get_xdata())]
        assert len(hollow) == 1 and list(hollow[0].get_xdata()) == [3e-2] and list(hollow[0].get_ydata()) == [5.2]
        assert hollow[0].get_color() == line.get_color()
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels[0] == "r=1" and labels[1].startswith("stopped early")
    finally:
        plt.close(fig)


def test_lr_plot_draws_failed_trials_apart_from_stopped_ones():
    """Trials rejected as unhealthy (ran to the last milestone, did not learn) were drawn as 'stopped early'
    hollow circles, level with the chosen LR's loss, as if ASHA had stopped them; they are hollow squares now."""
    from loopscale.sweep.lr_table import lr_figure

    series = {1: [(3.0, 4.77, True), (10.0, 4.76, "failed"), (30.0, 4.76, "failed"), (1.0, 5.0, False)]}
    fig = lr_figure(16, series)
    try:
        ax = fig.axes[0]
        line = next(ln for ln in ax.get_lines() if ln.get_label() == "r=1")
        assert list(line.get_xdata()) == [3.0]
        hollow = {ln.get_marker(): list(ln.get_xdata()) for ln in ax.get_lines()
                  if ln.get_markerfacecolor() == "none" and len(ln.get_xdata())}  # fmt: skip
        assert hollow == {"o": [1.0], "s": [10.0, 30.0]}
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels[1].startswith("stopped early") and labels[2].startswith("failed (raised, diverged")
    finally:
        plt.close(fig)


def test_lr_plot_keeps_a_diverged_trial_off_the_loss_axis():
    """A trial that diverged reports a 1e9 stand-in at its end: the figure used it as a loss, so the real losses
    (about 6.9) were squashed to the bottom of a 0-1e9 axis. Now its last real loss is used, and a trial with none
    is an x at the top of the axes."""
    from loopscale.sweep.lr_table import DIVERGED_LOSS, _last_real_loss, lr_figure

    assert _last_real_loss({1: 6.95, 2: 6.91, 3: DIVERGED_LOSS}) == 6.91
    assert _last_real_loss({3: DIVERGED_LOSS}) is None and _last_real_loss({1: float("nan")}) is None
    series = {1: [(1e-2, 3.5, True), (3e-2, 3.4, True), (50.0, 6.91, False), (200.0, None, False)]}
    fig = lr_figure(16, series)
    try:
        ax = fig.axes[0]
        lo, hi = ax.get_ylim()
        assert hi < 10  # the loss axis holds the losses, not the stand-in
        xs = [ln for ln in ax.get_lines() if ln.get_marker() == "x" and len(ln.get_xdata())]
        assert len(xs) == 1 and list(xs[0].get_xdata()) == [200.0] and list(xs[0].get_ydata()) == [0.97]
        assert "no finite loss (diverged)" in [t.get_text() for t in ax.get_legend().get_texts()]
    finally:
        plt.close(fig)


# --- the profile of the objective in phi: a non-negative axis -----------------------------------------------------


@pytest.mark.parametrize("n,scale", [(16, 1.0), (400, 1 / 300)])
def test_phi_profile_axis_starts_at_zero_with_no_negative_ticks(n, scale):
    from loopscale.fit.identify_plots import phi_profile_figure, profile_linthresh

    phi = np.round(np.arange(-1.5, 2.5001, 0.1), 10)
    rise = scale * np.minimum(8.0, 0.5 * np.abs(phi - 0.9) ** 1.2)
    rise[np.argmin(np.abs(phi - 0.9))] = 0.0
    fig = phi_profile_figure(pd.DataFrame({"phi": phi, "rel_rise": rise}), 0.908, (0.85, 0.99), n)
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        lo, hi = ax.get_ylim()
        assert lo == 0.0 and hi >= 100 * rise.max() and hi >= 100 * 2 / n  # the data and the 2/n line fit
        labels = _visible_labels(ax.yaxis)
        locs = [t for t in ax.yaxis.get_majorticklocs() if lo <= t <= hi]
        assert min(locs) == 0.0 and len(locs) >= 3
        assert all(t >= 0 for t in ax.yaxis.get_majorticklocs())
        assert not any("−" in lab.get_text() or "-" in lab.get_text() for lab in labels)
        lin = profile_linthresh(n)
        assert lin <= 100 * 2 / n  # the threshold line is on the log part
        assert f"linear below {lin:g} %" in ax.get_ylabel()  # the linear range is stated
    finally:
        plt.close(fig)


def test_plot_phi_profile_writes_png(tmp_path):
    from loopscale.fit.identify_plots import plot_phi_profile

    prof = pd.DataFrame({"phi": [0.0, 0.5, 1.0], "rel_rise": [0.3, 0.0, 0.2]})
    p = plot_phi_profile(prof, 0.5, None, 20, tmp_path / "profile.png")
    assert p.read_bytes()[:4] == b"\x89PNG" and not plt.get_fignums()


def test_lr_plot_of_one_study_for_every_r_has_one_line_named_for_it(tmp_path, monkeypatch):
    """With tune.tune_per_r false one study at the largest r gives every r its LR; the plot drew that study once
    per r (four identical lines, a legend of r = 1, 2, 4, 8 as if each had been tuned). Now: one line, named."""
    import optuna

    from loopscale.sweep import lr_table

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="size16_r8", storage=url)
    for loss in (4.0, 3.5):
        t = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)})
        t.report(loss, 1)
        study.tell(t, loss)
    rows = [{"size": 16, "r": r, "study_name": "size16_r8"} for r in (1, 2, 4, 8)]
    seen = {}
    monkeypatch.setattr(lr_table, "lr_figure", lambda size, series: seen.update(series) or plt.figure())
    lr_table._plot(tmp_path, url, rows)
    assert list(seen) == ["8 (its LR used for r = 1, 2, 4, 8)"] and len(seen["8 (its LR used for r = 1, 2, 4, 8)"]) == 2


def test_a_c_per_run_is_drawn_by_token_budget_not_as_one_curve_per_run():
    """A table of ordinary runs whose C column is each run's own C = 6 N D (12 distinct values per r) drew one
    IsoFLOP curve per run, with a legend running off the axes, and the bootstrap derived N*/D*/L* at every one of
    them (720 entries for 240 runs). Such a table is drawn at each D, and its frontier taken at 4 budgets spanning
    its C; an iso-FLOP grid's few C (whole steps apart in the last digits) stay one curve each."""
    from loopscale.fit.derived import FLOP_BUDGETS_MAX
    from loopscale.fit.plots import _curve_groups

    runs = _smoke_runs()
    per_run = pd.concat([runs.assign(D=runs["D"] * k, C=runs["C"] * k) for k in (1, 1.7, 2.9)], ignore_index=True)
    assert per_run.groupby("r")["C"].nunique().min() > 8 >= per_run.groupby("r")["D"].nunique().max()
    assert _curve_groups(per_run) == ("D", "")
    iso = runs.assign(C=np.where(runs["D"] == 2048, 5.0001e8, 1e9) * (1 + 1e-6 * np.arange(len(runs))))
    assert _curve_groups(iso) == ("C", "")
    fit = SimpleNamespace(params=SMOKE_PARAMS, law="joint", r2=0.99, law_object=lambda: make_law("joint"))
    from loopscale.fit.plots import fit_curves_figure

    fig = fit_curves_figure(fit, iso)
    try:
        assert sorted(_curves(fig.axes[0])) == ["C=1e+09", "C=5e+08"]
    finally:
        plt.close(fig)
    # the derived quantities: N*/D*/L* at 4 budgets spanning a C per run, at each C of a few
    from test_bootstrap import _small_joint  # an iso-FLOP joint table of 3 budgets

    from loopscale.fit.bootstrapping import bootstrap

    joint = _small_joint(noise=0.0)
    many = pd.concat([joint.assign(D=joint["D"] * k, C=joint["C"] * k) for k in (1, 1.3, 1.7, 2.2)],
                     ignore_index=True)  # fmt: skip
    assert many["C"].nunique() > FLOP_BUDGETS_MAX
    jittered = joint.assign(C=joint["C"] * (1 + 1e-6 * np.arange(len(joint))))  # whole steps: C off in 6th digit
    for table, n_budgets in ((joint, 3), (jittered, 3), (many, 4)):
        res = bootstrap(table, law="joint", B=3, workers=1, starts=10, seed=0)
        keys = [k for k in res.ci_derived if k.startswith("N_star_r1_C")]
        assert len(keys) == n_budgets, keys
    keys = sorted(float(k.split("_C")[1]) for k in res.ci_derived if k.startswith("N_star_r1_C"))
    assert keys[0] == pytest.approx(many["C"].min(), rel=1e-2) and keys[-1] == pytest.approx(many["C"].max(), rel=1e-2)
