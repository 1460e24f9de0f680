"""Design from measurements: predict, before training, how precisely a grid will measure phi and how long it runs.

A candidate design is a table of planned runs (one row per run: ``N_once``, ``N_rec``, ``r``, ``D`` tokens, ``C``
training FLOPs; seeds are separate rows). With a law taken as truth (usually the joint law fitted to a pilot or a
previous ``runs.parquet``) and the run-to-run noise measured between seeds, :func:`simulate_phi` draws the losses
the design would produce — ``L_i = L_law(run_i) * exp(sigma * eps_i)``, eps ~ N(0, 1) independently per run — and
refits the joint law (paper Eq. 3) with the product's own fitter (:func:`loopscale.fit.fitter.fit_law`) on each
draw. The spread of the refitted phi is the design's expected precision: its central 95 % range, halved, predicts
the half-width of the bootstrap interval a real run of the design would report. :func:`wall_time_s` turns the
design's FLOPs into minutes with a FLOP rate measured on the same machine (:func:`flop_rate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.fitter import fit_many
from loopscale.fit.io import cell_means, prepare, with_layers_unique
from loopscale.fit.laws import PHI_BOUNDS, make_law

__all__ = [
    "DesignPrediction",
    "simulate_phi",
    "simulate_design",
    "design_cell_means",
    "cell_noise",
    "match_cells",
    "seed_noise",
    "flop_rate",
    "wall_time_s",
    "RUN_KEYS",
    "NOISE_KEYS",
    "common_normals",
    "boot_index",
    "boot_half_widths",
    "half_width_se",
]

RUN_KEYS = ("variant", "d_model", "r", "layers_unique", "N_once", "N_rec", "D")
"""Columns that, when present, identify a cell: runs that share them and differ only in ``seed`` are replicates."""

NOISE_KEYS = ("r", "layers_unique", "d_model", "D")
"""Columns that match a planned cell to a measured one (same architecture, width and token budget)."""

CELL_KEYS = ("d_model", "r", "layers_unique", "N_once", "N_rec", "D")
"""Columns (those present) whose rows :func:`simulate_design` averages over seeds
(:func:`loopscale.fit.io.cell_means`)."""


def design_cell_means(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`loopscale.fit.io.cell_means` over the :data:`CELL_KEYS` columns ``table`` has (ok, finite rows)."""
    df = _ok_rows(table)
    df = df[np.isfinite(df["loss"].astype(float))]
    return cell_means(df, tuple(k for k in CELL_KEYS if k in df.columns))


@dataclass(frozen=True)
class DesignPrediction:
    """What a design is expected to measure.

    Attributes:
        n_runs: runs in the design. n_sim: simulated replicates refitted (``n_ok`` finished).
        phi_half_width: half the central 95 % range of the refitted phi (predicted CI half-width).
        phi_sd: standard deviation of the refitted phi. phi_bias: mean refitted phi minus the truth.
        on_bound_frac: share of refits with phi on the search-box edge (a design that cannot identify phi has a
            large share). r_phi_half_width: the same half-width for r^phi, per r > 1.
        n_cells: the design's cells, the distinct (N_once, N_rec, r, D) it fits (0 where not counted).
        phi_half_width_se, worth_half_width_se: Monte-Carlo standard error of ``phi_half_width`` and of each
            ``worth_half_width`` (:func:`half_width_se`: a bootstrap over the draws; NaN where not computed).
        phi_draws, worth_draws: the refitted phi and worth of every draw, draw i at index i (NaN where the draw
            gave none), so that candidates simulated with the same ``seed`` can be compared draw by draw.
    """

    n_runs: int
    n_sim: int
    n_ok: int
    phi_true: float
    phi_half_width: float
    phi_sd: float
    phi_bias: float
    on_bound_frac: float
    r_phi_half_width: dict[int, float] = field(default_factory=dict)
    worth_true: dict[int, float] = field(default_factory=dict)
    worth_half_width: dict[int, float] = field(default_factory=dict)
    n_cells: int = 0
    phi_half_width_se: float = float("nan")
    worth_half_width_se: dict[int, float] = field(default_factory=dict)
    phi_draws: tuple[float, ...] = ()
    worth_draws: dict[Any, tuple[float, ...]] = field(default_factory=dict)
    worth_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (dict keys r as strings; the per-draw values ``phi_draws`` and ``worth_draws`` are left
        out)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("phi_draws", "worth_draws")}
        for k in ("r_phi_half_width", "worth_true", "worth_half_width", "worth_half_width_se"):
            out[k] = {str(r): v for r, v in getattr(self, k).items()}
        return out


def _half_width(x: np.ndarray, level: float) -> float:
    """Half the central ``level`` range of the finite values of ``x`` (NaN with fewer than 2)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    a = (1 - level) / 2
    return float((np.quantile(x, 1 - a) - np.quantile(x, a)) / 2) if x.size >= 2 else float("nan")


MC_BOOT = 400
"""Bootstrap resamples of the draws behind a half-width's Monte-Carlo standard error (:func:`half_width_se`)."""


def boot_index(n_sim: int, seed: int = 0, n_boot: int = MC_BOOT) -> np.ndarray:
    """Resampled draw indices, shape (n_boot, n_sim): the same for every candidate simulated with one ``seed`` and
    ``n_sim``, so that half-widths of candidates (whose draw i shares its normal deviates) are resampled in pairs."""
    return np.random.default_rng([int(seed), 0x5E]).integers(0, n_sim, size=(n_boot, n_sim))


def boot_half_widths(draws: np.ndarray, idx: np.ndarray, level: float = 0.95) -> np.ndarray:
    """Half-width (half the central ``level`` range of the finite values) of every resample ``draws[idx[b]]``.

    Args:
        draws: per-draw values, shape (n_sim,) (NaN: no value in that draw). idx: :func:`boot_index`'s indices.
    Returns:
        Shape (n_boot,); NaN for a resample with fewer than 2 finite values.
    """
    x = np.asarray(draws, dtype=float)[idx]
    a = (1 - level) / 2
    ok = np.isfinite(x).sum(axis=1) >= 2
    out = np.full(x.shape[0], np.nan)
    if ok.any():
        q = np.nanquantile(x[ok], [a, 1 - a], axis=1)
        out[ok] = (q[1] - q[0]) / 2
    return out


def half_width_se(draws: np.ndarray, seed: int = 0, level: float = 0.95) -> float:
    """Monte-Carlo standard error of :func:`_half_width` of ``draws`` (shape (n_sim,)): the standard deviation of
    the half-width over :data:`MC_BOOT` bootstrap resamples of the draws (NaN with fewer than 2 finite draws)."""
    x = np.asarray(draws, dtype=float)
    if np.isfinite(x).sum() < 2:
        return float("nan")
    hw = boot_half_widths(x, boot_index(x.size, seed), level)
    return float(np.nanstd(hw, ddof=1))


def _ok_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows with status ``ok`` (all rows without a status column) and a ``loss`` column (from final_val_loss)."""
    df = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    if "loss" not in df.columns and "final_val_loss" in df.columns:
        df = df.assign(loss=df["final_val_loss"])
    return df


def cell_noise(runs: pd.DataFrame, keys: tuple[str, ...] = NOISE_KEYS) -> pd.DataFrame:
    """Seed-to-seed spread of every measured cell: standard deviation of the loss (nats/token) between its seeds.

    Args:
        runs: one row per run (``runs.parquet`` schema: ``final_val_loss`` or ``loss``, ``status``, cell columns;
            ``layers_unique`` is derived from ``n_prelude + n_recur_block + n_coda`` when absent).
        keys: cell columns (those present are used).
    Returns:
        One row per cell with >= 2 finite ok runs: the key columns, ``sd`` (nats/token, ddof = 1) and ``n_seeds``.
    """
    df = with_layers_unique(_ok_rows(runs))
    ks = [k for k in keys if k in df.columns]
    df = df[np.isfinite(df["loss"].astype(float))]
    g = df.groupby(ks, dropna=False, sort=True)["loss"].agg(sd="std", n_seeds="size").reset_index()
    return g[g["n_seeds"] >= 2].reset_index(drop=True)


def match_cells(design: pd.DataFrame, measured: pd.DataFrame, value: str, keys: tuple[str, ...] = NOISE_KEYS):
    """Give every planned run the ``value`` of its measured cell, matched on ``keys`` (float-tolerant).

    A run without a measured cell takes the median of the measured cells with its r, else the median of all.

    Args:
        design: planned runs (one row per run) with the ``keys`` columns present in ``measured``.
        measured: one row per measured cell with ``keys`` and ``value`` (e.g. :func:`cell_noise`'s ``sd``).
    Returns:
        ``(values, sources)``: an array of shape (len(design),) and, per run, ``"cell"``, ``"median of r=<r>"`` or
        ``"median of all cells"``.
    Raises:
        ValueError: ``measured`` is empty.
    """
    if measured.empty:
        raise ValueError(f"no measured cell to take {value!r} from")
    ks = [k for k in keys if k in design.columns and k in measured.columns]
    table = {tuple(round(float(x), 6) for x in row[ks]): float(row[value]) for _, row in measured.iterrows()}
    by_r = measured.groupby("r")[value].median().to_dict() if "r" in measured.columns else {}
    overall = float(measured[value].median())
    vals, src = np.empty(len(design)), []
    for i, (_, row) in enumerate(design.iterrows()):
        key = tuple(round(float(x), 6) for x in row[ks])
        if key in table:
            vals[i], how = table[key], "cell"
        elif "r" in row and float(row["r"]) in by_r:
            vals[i], how = by_r[float(row["r"])], f"median of r={int(row['r'])}"
        else:
            vals[i], how = overall, "median of all cells"
        src.append(how)
    return vals, src


def simulate_phi(
    design: pd.DataFrame,
    truth: dict[str, float],
    noise_rel: float,
    *,
    n_sim: int = 40,
    starts: int = 30,
    seed: int = 0,
    level: float = 0.95,
) -> DesignPrediction:
    """Simulate ``design`` under ``truth`` with relative noise ``noise_rel`` and refit phi ``n_sim`` times.

    Args:
        design: planned runs, columns ``N_once``, ``N_rec``, ``r``, ``D`` (one row per run, seeds as rows).
        truth: joint-law parameters ``E, A, alpha, B, beta, phi`` (loss in nats/token).
        noise_rel: standard deviation of log-loss between seeds (e.g. 0.01 for 1 %).
        n_sim: simulated replicates. starts: starts per refit. level: interval level of the prediction.
    Raises:
        ValueError: missing columns or parameters, noise_rel < 0, n_sim < 2.
    """
    need = {"N_once", "N_rec", "r", "D"}
    if need - set(design.columns):
        raise ValueError(f"design needs columns {sorted(need)}; missing {sorted(need - set(design.columns))}")
    missing = {"E", "A", "alpha", "B", "beta", "phi"} - set(truth)
    if missing:
        raise ValueError(f"truth needs the joint-law parameters; missing {sorted(missing)}")
    if not noise_rel >= 0:
        raise ValueError(f"noise_rel must be >= 0 (relative SD of the loss between seeds), got {noise_rel}")
    if n_sim < 2:
        raise ValueError(f"n_sim must be >= 2, got {n_sim}")
    cols = {c: design[c].to_numpy(dtype=float) for c in ("N_once", "N_rec", "r", "D")}
    mean = make_law("joint").predict(truth, cols)
    rng = np.random.default_rng(seed)
    rs = sorted(int(r) for r in np.unique(cols["r"]) if r > 1)
    phis, on_bound = [], 0
    base = pd.DataFrame({**cols, "status": "ok"})
    law = make_law("joint")
    warm = law.from_public(truth)  # the truth is one start; the others are the fitter's usual sub-fit/random ones
    datas, seeds, which = [], [], []
    phi_d = np.full(n_sim, np.nan)  # per draw (NaN: a draw the fitter refused or that did not fit)
    for i in range(n_sim):
        sim = base.assign(loss=mean * np.exp(noise_rel * rng.standard_normal(mean.shape)))
        try:
            datas.append(prepare(sim, law))
        except ValueError:  # a draw the fitter refuses: skipped
            continue
        seeds.append(int(rng.integers(1 << 31)))
        which.append(i)
    # every draw's refit advances in one batch (the values of one fit_data each)
    for f, i in zip(fit_many(law, datas, seeds, starts=starts, grid=False, warm=warm, n_polish=1), which, strict=True):
        if f is None:
            continue
        phis.append(f.params["phi"])
        phi_d[i] = f.params["phi"]
        on_bound += int("phi" in f.on_bound or not PHI_BOUNDS[0] < f.params["phi"] < PHI_BOUNDS[1])
    phis_a = np.asarray(phis)

    def half(x: np.ndarray) -> float:
        return _half_width(x, level)

    return DesignPrediction(
        n_runs=len(design),
        n_sim=n_sim,
        n_ok=int(phis_a.size),
        phi_true=float(truth["phi"]),
        phi_half_width=half(phis_a),
        phi_sd=float(phis_a.std(ddof=1)) if phis_a.size >= 2 else float("nan"),
        phi_bias=float(phis_a.mean() - truth["phi"]) if phis_a.size else float("nan"),
        on_bound_frac=on_bound / max(1, int(phis_a.size)),
        r_phi_half_width={r: half(float(r) ** phis_a) for r in rs},
        n_cells=int(base[["N_once", "N_rec", "r", "D"]].drop_duplicates().shape[0]),
        phi_half_width_se=half_width_se(phi_d, seed, level),
        phi_draws=tuple(float(x) for x in phi_d),
    )


def has_ladder(design: pd.DataFrame) -> bool:
    """True when every (d_model, D) cell with looped runs has plain r = 1 runs at two or more depths
    (``layers_unique``): a unique-depth ladder on which the worth in unique layers is read."""
    if not {"d_model", "layers_unique", "r", "D"} <= set(design.columns):
        return False
    looped = design[design["r"] > 1][["d_model", "D"]].drop_duplicates()
    depths = design[design["r"] == 1].groupby(["d_model", "D"])["layers_unique"].nunique()
    return len(looped) > 0 and all(depths.get((d, D), 0) >= 2 for d, D in looped.itertuples(index=False))


def _ladder_within_noise(runs: pd.DataFrame) -> str | None:
    """Why the plain ladder of ``runs`` (one row per planned run: ``loss`` the truth's, ``noise_sd``, ``r``,
    ``layers_unique``, ``d_model``, ``D``) is too shallow for its seeds, or None: its loss falls from the
    shallowest to the deepest rung by less than twice the standard error of a rung's seed mean (noise_sd over
    the root of its seeds), in some (d_model, D) cell with looped runs."""
    for (d, D), cell in runs.groupby(["d_model", "D"], sort=True):
        plain = cell[cell["r"] == 1]
        if not (cell["r"] > 1).any() or plain["layers_unique"].nunique() < 2:
            continue
        g = plain.groupby("layers_unique")
        means, se = g["loss"].mean(), g["noise_sd"].max() / np.sqrt(g.size())
        drop = float(means.iloc[0] - means.iloc[-1])
        if drop < 2.0 * float(se.max()):
            return (f"the law taken as truth (fitted to the pilot) lowers the plain ladder's loss at d_model {d}, "
                    f"D {D:g} by {drop:.2g} nats from {means.index[0]:g} to {means.index[-1]:g} layers, less than "
                    f"twice the standard error of a rung's mean ({float(se.max()):.2g} nats)")
    return None


def _worth_by_r(runs: pd.DataFrame) -> dict[Any, float]:
    """Worth in unique layers of every looped model of ``runs`` (one row per run), keyed by r — or by
    ``"r/d_model/D"`` when a design has several looped cells at one r — computed by the report's own
    :func:`loopscale.fit.ladder.ladder_table` (point estimates; its bootstrap is not needed here)."""
    from loopscale.fit.ladder import ladder_table

    w = ladder_table(runs, n_boot=1)
    if w.empty:
        return {}
    unique_r = not w["r"].duplicated().any()
    return {
        (int(row.r) if unique_r else f"{int(row.r)}/{int(row.d_model)}/{row.D:g}"): float(row.worth_layers)
        for row in w.itertuples()
    }


def simulate_design(
    design: pd.DataFrame,
    truth: dict[str, float],
    *,
    n_sim: int = 40,
    starts: int = 20,
    seed: int = 0,
    level: float = 0.95,
    ladder: bool = True,
) -> DesignPrediction:
    """Simulate a planned design run by run with per-run noise, average each cell over its seeds, and refit.

    Every draw: ``loss_i = L_law(run_i) + noise_sd_i * eps_i`` (eps ~ N(0, 1) independently per run, nats/token;
    :func:`common_normals`: a run's eps in draw i is fixed by the seed, i, its cell and its seed number, so designs
    that share seeds share their deviates),
    then the cell means (:func:`loopscale.fit.io.cell_means`) and the joint law (paper Eq. 3) refitted to them with
    the product's fitter — the way the analysis fits a design with replicates; with ``ladder`` and a unique-depth ladder in the design,
    also each looped model's worth in unique layers from the simulated runs (:mod:`loopscale.fit.ladder`, as the
    report computes it). The spread of the refits over the draws predicts the half-width of the interval a real
    run of the design reports.

    Args:
        design: planned runs, one row per run (seeds as rows): ``N_once``, ``N_rec``, ``r``, ``D`` (tokens),
            ``noise_sd`` (nats/token, the seed SD of the run's cell); the worth needs ``d_model``,
            ``layers_unique`` and ``seed`` too. Other :data:`RUN_KEYS` columns present define the cells.
        truth: joint-law parameters ``E, A, alpha, B, beta, phi`` (loss in nats/token).
        n_sim: simulated draws (>= 2). starts: starts per refit. seed: RNG seed. level: interval level.
        ladder: also predict the worth in unique layers (when the design has a ladder).
    Returns:
        :class:`DesignPrediction` with ``phi_half_width`` (and its Monte-Carlo standard error
        ``phi_half_width_se``), ``r_phi_half_width`` per r > 1 and, with a ladder, ``worth_true`` (the truth's
        worth in layers) and ``worth_half_width`` (with ``worth_half_width_se``) per looped cell — or, when the
        truth's own ladder does not fall with depth, none and ``worth_note`` saying why; the per-draw values in
        ``phi_draws`` and ``worth_draws``.
    Raises:
        ValueError: missing columns or parameters, a negative or non-finite ``noise_sd``, n_sim < 2, or a design
            the fitter refuses (e.g. a single r).
    """
    need = {"N_once", "N_rec", "r", "D", "noise_sd"}
    if need - set(design.columns):
        raise ValueError(f"design needs columns {sorted(need)}; missing {sorted(need - set(design.columns))}")
    missing = {"E", "A", "alpha", "B", "beta", "phi"} - set(truth)
    if missing:
        raise ValueError(f"truth needs the joint-law parameters; missing {sorted(missing)}")
    sd = design["noise_sd"].to_numpy(dtype=float)
    if not np.all(np.isfinite(sd) & (sd >= 0)):
        raise ValueError("noise_sd must be finite and >= 0 on every run (nats/token)")
    if n_sim < 2:
        raise ValueError(f"n_sim must be >= 2, got {n_sim}")
    law = make_law("joint")
    cols = {c: design[c].to_numpy(dtype=float) for c in ("N_once", "N_rec", "r", "D")}
    mean = law.predict(truth, cols)
    base = design.assign(status="ok", seed=design["seed"] if "seed" in design.columns else 0)
    noiseless = design_cell_means(base.assign(loss=mean))
    prepare(noiseless, law)  # the fitter's refusals, before any draw
    do_ladder = ladder and has_ladder(design)
    worth_true, worth_note = {}, None
    if do_ladder:
        try:
            truth_runs = base.assign(loss=mean)
            worth_true = _worth_by_r(truth_runs)
            if weak := _ladder_within_noise(truth_runs):
                worth_true, worth_note = {}, (
                    f"the worth in unique layers is not predicted: {weak}, so the simulated ladders do not fall "
                    "with depth reliably and a looped model's place on them is unbounded; the pilot's own ladder "
                    "(see its report) says whether depth helps at these widths and budgets"
                )
        except ValueError as e:  # the truth's own ladder does not fall with depth: no worth to predict
            worth_note = (
                "the worth in unique layers is not predicted: the law taken as truth (fitted to the pilot) gives "
                f"this design's plain ladder a loss that does not fall with depth ({_slope_words(str(e))}), so no "
                "looped model can be placed on it; the pilot's own ladder (see its report) says whether depth helps "
                "at these widths and budgets"
            )
    warm = law.from_public(truth)
    phi_d = np.full(n_sim, np.nan)
    worth_d = {k: np.full(n_sim, np.nan) for k in worth_true}
    on_bound = 0
    datas, seeds, sims, which = [], [], [], []
    eps = common_normals(base, n_sim, seed)
    for i in range(n_sim):
        sim = base.assign(loss=mean + sd * eps[i])
        try:
            datas.append(prepare(design_cell_means(sim), law))
        except ValueError:  # a draw the fitter refuses (e.g. a loss <= 0): skipped
            continue
        seeds.append(int(np.random.default_rng([int(seed), i, 0xF17]).integers(1 << 31)))
        sims.append(sim)
        which.append(i)
    # every draw's refit advances in one batch (the values of one fit_data each)
    for f, sim, i in zip(fit_many(law, datas, seeds, starts=starts, grid=False, warm=warm, n_polish=1), sims, which,
                         strict=True):  # fmt: skip
        if f is None:
            continue
        phi_d[i] = f.params["phi"]
        on_bound += int("phi" in f.on_bound or not PHI_BOUNDS[0] < f.params["phi"] < PHI_BOUNDS[1])
        if worth_true:
            try:
                w = _worth_by_r(sim)
            except ValueError:  # a draw whose ladder does not fall with depth: no worth in this draw
                w = {}
            for k in worth_d:
                worth_d[k][i] = w.get(k, np.nan)
    phis_a = phi_d[np.isfinite(phi_d)]
    rs = sorted(int(r) for r in np.unique(cols["r"]) if r > 1)
    worth_hw = {k: _half_width(v, level) for k, v in worth_d.items()}
    worth_se = {k: half_width_se(v, seed, level) for k, v in worth_d.items()}
    if worth_d and (unbounded := _unbounded_worth(worth_d, worth_hw, np.isfinite(phi_d), base, level)):
        for k in unbounded:
            worth_hw[k] = worth_se[k] = float("nan")
        worth_note = _unbounded_note(unbounded)
    return DesignPrediction(
        n_runs=len(design),
        n_sim=n_sim,
        n_ok=int(phis_a.size),
        phi_true=float(truth["phi"]),
        phi_half_width=_half_width(phis_a, level),
        phi_sd=float(phis_a.std(ddof=1)) if phis_a.size >= 2 else float("nan"),
        phi_bias=float(phis_a.mean() - truth["phi"]) if phis_a.size else float("nan"),
        on_bound_frac=on_bound / max(1, int(phis_a.size)),
        r_phi_half_width={r: _half_width(float(r) ** phis_a, level) for r in rs},
        worth_true=worth_true,
        worth_half_width=worth_hw,
        n_cells=len(noiseless),
        phi_half_width_se=half_width_se(phi_d, seed, level),
        worth_half_width_se=worth_se,
        phi_draws=tuple(float(x) for x in phi_d),
        worth_draws={k: tuple(float(x) for x in v) for k, v in worth_d.items()},
        worth_note=worth_note,
    )


LEAVES_LADDER = "where its interval leaves the ladder"
"""The words of a :attr:`DesignPrediction.worth_note` on a candidate's own draws (:func:`_unbounded_note`)."""


def _unbounded_worth(worth_d: dict, worth_hw: dict, fitted: np.ndarray, design: pd.DataFrame,
                     level: float) -> dict[Any, str]:
    """The looped cells whose simulated worth in unique layers has no bounded interval, each with why: in more than
    ``(1 - level) / 2`` of the refitted draws (``fitted``) the ladder did not fall with depth (no worth), or the
    half-width is wider than the design's plain ladder spans (its deepest minus its shallowest rung, in layers).
    Either way the interval's ends lie off the ladder, where a nearly flat simulated ladder placed a looped model at
    hundreds (or 1e72) of layers; a half-width taken over the other draws looked like a precision."""
    depths = design.loc[design["r"] == 1, "layers_unique"].astype(float)
    span = float(depths.max() - depths.min()) if len(depths) else float("nan")
    out = {}
    n = int(fitted.sum())
    for k, v in worth_d.items():
        lost = int((~np.isfinite(v[fitted])).sum())
        if n and lost > (1 - level) / 2 * n:
            out[k] = f"its ladder did not fall with depth in {lost} of {n} draws"
        elif np.isfinite(worth_hw[k]) and worth_hw[k] > span:
            out[k] = (f"its half-width ({worth_hw[k]:.3g} layers) is wider than the ladder's span "
                      f"({depths.min():g} to {depths.max():g} layers)")
    return out


def _unbounded_note(unbounded: dict[Any, str]) -> str:
    """:attr:`DesignPrediction.worth_note` for :func:`_unbounded_worth`'s cells."""
    which = "; ".join(f"r = {k}: {why}" if isinstance(k, int) else f"{k} (r/d_model/D): {why}"
                      for k, why in unbounded.items())  # fmt: skip
    return (f"the worth in unique layers is not predicted {LEAVES_LADDER} ({which}): the "
            "simulated ladders are too flat for these seeds to place a looped model on them; more seeds per rung, "
            "or rungs further apart, narrow it")


def _slope_words(message: str) -> str:
    """The ``slope ... nats per log-layer`` part of :func:`loopscale.fit.ladder.ladder_table`'s refusal, else the
    whole message."""
    import re

    m = re.search(r"slope [^)]*", message)
    return m.group(0) if m else message


def common_normals(runs: pd.DataFrame, n_sim: int, seed: int = 0) -> np.ndarray:
    """Standard normal deviates for every draw and run, common to all designs simulated with one ``seed``.

    A run's deviate in draw i depends only on (seed, i, its cell, its seed number): two candidates that differ in
    their seeds per cell share the deviates of the seeds they have in common (common random numbers), so their
    difference in half-width is far less noisy than with independent draws.

    Args:
        runs: planned runs, one row per run; the cell is given by the :data:`NOISE_KEYS` columns present (and
            ``variant``), the seed number by ``seed`` (0 when absent; non-negative integers).
        n_sim: draws. seed: RNG seed.
    Returns:
        Shape (n_sim, len(runs)).
    """
    keys = [k for k in ("variant", *NOISE_KEYS) if k in runs.columns]
    sn = runs["seed"].to_numpy(dtype=np.int64) if "seed" in runs.columns else np.zeros(len(runs), dtype=np.int64)
    out = np.empty((n_sim, len(runs)))
    if not keys:
        groups = {(): np.arange(len(runs))}
    else:
        groups = runs.reset_index(drop=True).groupby(keys, sort=False, dropna=False).indices
    for key, rows in groups.items():
        key = key if isinstance(key, tuple) else (key,)
        # the cell's own stream: integer entropy from its key (strings by their bytes, numbers rounded)
        ent = [int(seed) & 0xFFFFFFFF]
        for v in key:
            if isinstance(v, str):
                ent += list(v.encode())
            else:
                ent.append(int(round(float(v) * 1000)) & 0xFFFFFFFFFFFF)
        top = int(sn[rows].max()) + 1
        for i in range(n_sim):
            out[i, rows] = np.random.default_rng([*ent, 7, i]).standard_normal(top)[sn[rows]]
    return out


def seed_noise(runs: pd.DataFrame) -> tuple[float, int]:
    """Pooled relative run-to-run noise: SD of log-loss between seeds of the same cell, and the cells used.

    Cells are the rows sharing every :data:`RUN_KEYS` column present; only cells with >= 2 ok runs count.
    Returns ``(sigma, n_cells)``; ``(nan, 0)`` when no cell has two seeds.
    """
    df = runs
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    loss_col = "loss" if "loss" in df.columns else "final_val_loss"
    keys = [k for k in RUN_KEYS if k in df.columns]
    ss, dof, cells = 0.0, 0, 0
    for _, g in df.groupby(keys, dropna=False):
        x = np.log(g[loss_col].to_numpy(dtype=float))
        x = x[np.isfinite(x)]
        if x.size >= 2:
            ss += float(((x - x.mean()) ** 2).sum())
            dof += x.size - 1
            cells += 1
    return (float(np.sqrt(ss / dof)) if dof else float("nan")), cells


def flop_rate(runs: pd.DataFrame) -> float:
    """Median training FLOP/s per run (``C / wall_s`` over ok runs): the machine's rate for one run slot.

    Raises:
        ValueError: no ok run with ``C`` and ``wall_s``.
    """
    df = runs
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    if not {"C", "wall_s"} <= set(df.columns) or df.empty:
        raise ValueError("flop_rate needs ok runs with columns C (FLOPs) and wall_s (seconds)")
    rate = (df["C"].astype(float) / df["wall_s"].astype(float)).replace([np.inf, -np.inf], np.nan).dropna()
    if rate.empty:
        raise ValueError("no run has a finite C / wall_s")
    return float(rate.median())


def wall_time_s(design: pd.DataFrame, rate: float | np.ndarray, slots: int, overhead_s: float = 5.0) -> float:
    """Predicted wall time (s) of ``design``: its runs' FLOPs at ``rate`` FLOP/s per slot, ``slots`` runs at once.

    Longest-first packing onto ``slots`` (the grid's scheduler runs whatever is free), plus ``overhead_s`` per run.

    Args:
        design: planned runs with ``C`` (training FLOPs per run).
        rate: FLOP/s of one slot: one number, or one per run (shape (len(design),), e.g. per measured cell).
        slots: runs trained at once. overhead_s: seconds added to every run.
    Raises:
        ValueError: missing ``C`` column, a rate <= 0 (or of the wrong shape), slots < 1.
    """
    if "C" not in design.columns:
        raise ValueError("design needs a C column (training FLOPs per run)")
    rates = np.full(len(design), float(rate)) if np.ndim(rate) == 0 else np.asarray(rate, dtype=float)
    if rates.shape != (len(design),) or not np.all(rates > 0) or slots < 1:
        raise ValueError(f"rate must be > 0 (one or one per run) and slots >= 1, got rate={rate}, slots={slots}")
    t = np.sort(design["C"].to_numpy(dtype=float) / rates + overhead_s)[::-1]
    load = np.zeros(int(slots))
    for x in t:
        load[np.argmin(load)] += x
    return float(load.max())
