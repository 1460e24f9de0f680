"""The run report: ``DIR/report.md`` plus PNGs, rebuilt from the files a ``loopscale run`` wrote.

Inputs (all optional except ``runs.parquet`` and ``fit/analysis.json``): ``runs.parquet`` and ``curves.parquet``
(sweep results), ``lr_table.parquet`` (stage 1), ``fit/analysis.json`` and ``fit/<variant>/*`` (the fit stage,
:func:`loopscale.fit.analysis.analyze`), ``fit/frontier.parquet``, ``fit/isoflop.parquet`` and ``run_meta.json``
(stage timings). Nothing is refitted: ``loopscale report DIR`` only reads and draws.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import typer

from loopscale.fit.analysis import JOINT_PARAMS, FitOutcome, phi_identified, phi_not_identified
from loopscale.fit.identify import d_term_unidentified, phi_interval_on_bound
from loopscale.fit.laws import make_law


def _paper_phi(vname: str, runs) -> str | None:
    """The paper's φ for a variant of this name (Table 2 for the baseline over all 116 runs; Table 3's case studies on
    the four lower budgets for ``trunc_bptt`` and ``hyperconnect``), as the report's φ line cites it; None for a
    name the paper has no fit of."""
    if vname == "baseline":
        return "0.46 [0.41, 0.53] at GPU scale"
    if vname == "trunc_bptt":
        return "0.38 with bptt_k = ⌈r/2⌉ at GPU scale (Table 3, whose baseline is 0.45)"
    if vname == "hyperconnect":
        lanes = None
        if runs is not None and "hc_lanes" in runs.columns and "variant" in runs.columns:
            got = runs.loc[runs["variant"].astype(str) == vname, "hc_lanes"].dropna().unique()
            lanes = int(got[0]) if len(got) == 1 else None
        other = f"; these runs have {lanes} lanes" if lanes not in (None, 2) else ""
        return f"0.65 with 2 lanes at GPU scale (Table 3, whose baseline is 0.45{other})"
    return None


def _variant_model_line(runs, vname: str) -> str | None:
    """How the looped runs (r > 1) of variant ``vname`` were built, from their ``runs.parquet`` columns: the
    injection, the hyperconnection lanes K, and full or truncated backpropagation through time (``bptt_k`` per r);
    None when the table has no such runs or columns."""
    need = {"variant", "r", "injection", "bptt_k"}
    if not need <= set(runs.columns):
        return None
    rows = runs[(runs["variant"].astype(str) == vname) & (runs["r"] > 1)]
    if rows.empty:
        return None
    inj = sorted(str(x) for x in rows["injection"].dropna().unique())
    parts = [f"injection {', '.join(inj)}"]
    if "hyperconnect" in inj and "hc_lanes" in rows.columns:
        lanes = sorted(int(x) for x in rows.loc[rows["injection"] == "hyperconnect", "hc_lanes"].dropna().unique())
        parts.append(f"K = {', '.join(map(str, lanes))} lanes")
    by_r = rows.groupby("r")["bptt_k"].agg(lambda k: sorted(set(int(x) for x in k.dropna())))
    if all(ks == [int(r)] for r, ks in by_r.items()):
        parts.append("full backpropagation through time (bptt_k = r)")
    else:
        ks = ", ".join("/".join(map(str, k)) for k in by_r)
        rs = ", ".join(str(int(r)) for r in by_r.index)
        parts.append(f"truncated backpropagation through time: bptt_k = {ks} at r = {rs}")
    return "Looped runs (r > 1): " + "; ".join(parts) + "."


def _any_parabola(iso) -> bool:
    """Whether an IsoFLOP table (``fit/isoflop.parquet``; None when absent) has a cell of 3 or more sizes, i.e. a
    parabola was fitted (a table of an earlier loopscale lists only such cells)."""
    if iso is None or not len(iso):
        return False
    return "n_sizes" not in iso.columns or bool((iso["n_sizes"] >= 3).any())


def _fmt(x: Any, nd: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    x = float(x)
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.{max(nd - 1, 1)}e}"
    return f"{x:.{nd}g}"


def _ci(ci: dict, key: str, nd: int = 4) -> str:
    """``[lo, hi]`` to ``nd`` significant digits (as :func:`_fmt`; give the estimate's), or "–" when there is no
    interval (missing, or null bounds: no resample could be refitted)."""
    v = _interval(ci, key)
    return f"[{_fmt(v[0], nd)}, {_fmt(v[1], nd)}]" if v else "–"


def _interval(ci: dict, key: str) -> tuple[float, float] | None:
    """(lo, hi) of ``ci[key]`` when both bounds are finite numbers, else None."""
    v = (ci or {}).get(key)
    if not v or any(x is None or not math.isfinite(float(x)) for x in v[:2]):
        return None
    return float(v[0]), float(v[1])


RUN_REFUSES = None
"""``(folder) -> str | None``: why ``loopscale run`` of a folder without a fit would be refused (its runs all finished
with nothing its fit stage can fit), said by a report of that folder in place of the command that fits it. The
loopscale command line sets it (:func:`loopscale.sweep.run.folder_nothing_to_fit`): fit/ knows no spec."""


def _rerun_line(d: Path, resume: bool = True) -> str:
    """The command that resumes (``resume``; else starts) the run in folder ``d`` (its ``spec.yaml``, else
    ``SPEC``), shell-quoted."""
    spec = shlex.quote(str(d / "spec.yaml")) if (d / "spec.yaml").is_file() else "SPEC"
    return f"loopscale run {spec} --out {shlex.quote(str(d))}" + " --resume" * resume


def study_r(study_name: Any) -> int | None:
    """The r an LR study ran at, from its name (``<spec>_size<s>_r<r>``), or None: an LR table written before its
    ``tuned_r`` column was recorded names it there only."""
    m = re.search(r"_r(\d+)$", str(study_name or ""))
    return int(m.group(1)) if m else None


def no_runs_table_message(d: Path, torn: bool) -> str:
    """Why ``report`` (or ``fit``) has no runs table in ``d``, and what rebuilds it: the runs' own records under ``parts/``
    (``loopscale run ... --resume`` consolidates them, training only runs missing there), or a run of a folder
    with none; a folder no loopscale command wrote is said to be none."""
    parts = d / "parts" / "runs"
    has_parts = parts.is_dir() and any(parts.glob("*.parquet"))
    what = (f"{d / 'runs.parquet'} was unreadable (torn or corrupt) and was moved aside (runs.parquet.unreadable-*)"
            if torn else f"{d / 'runs.parquet'} not found")  # fmt: skip
    if not is_loopscale_folder(d):
        return (f"{what}, and {d} is not a loopscale output folder (no spec.yaml, run_meta.json or parts/): give the "
                "output folder of `loopscale run` (its --out)")  # fmt: skip
    if has_parts:
        return (f"{what}; its runs' own records are still in {parts}: `{_rerun_line(d)}` "
                "rebuilds it from them, training only the runs missing there, then fits and reports")
    # logs/ of `loopscale tune-lr` commands only are no sign of a grid's runs (logs/command.json names each command)
    marks = ("run_meta.json", "tune", "fit") + (() if _only_commands(d, {"tune-lr"}) else ("logs",))
    if not torn and not any((d / n).exists() for n in marks):
        # a folder `loopscale design --out` or `loopscale tune-lr` (or a stopped run before its grid's first record)
        # prepared: nothing of the grid trained yet (`run` uses an LR table there, as it skips every stage done)
        held = [w for f, w in (("design_prediction.json", "a design prediction"),
                               ("lr_table.parquet", "its LR table")) if (d / f).is_file()]  # fmt: skip
        return (f"{what}: no run of the grid has been trained in {d} yet (it holds its spec"
                f"{''.join(', and ' + w for w in held)}): "
                f"`{_rerun_line(d, resume=False)}` trains the grid, fits it and writes the report")
    return (f"{what}, and {d} holds no other record of its runs (no parts/): `{_rerun_line(d)}` trains them "
            "again, or restore runs.parquet from a copy")


def _only_commands(d: Path, kinds: set[str]) -> bool:
    """Whether every command ``d/logs/command.json`` records (the last and its ``earlier_commands``) is of ``kinds``
    (e.g. ``{"tune-lr"}``); False without a readable record."""
    try:
        rec = json.loads((d / "logs" / "command.json").read_text(encoding="utf-8"))
        seen = [rec.get("kind"), *(c.get("kind") for c in rec.get("earlier_commands") or [])]
    except (OSError, ValueError, AttributeError):
        return False
    return bool(seen) and all(k in kinds for k in seen)


def is_loopscale_folder(d: Path) -> bool:
    """Whether a loopscale command wrote ``d`` (its spec, run record, logs, Tune state, fit or runs' parts): only
    then does ``report`` move an unreadable file of it aside."""
    parts = d / "parts" / "runs"
    return (parts.is_dir() and any(parts.glob("*.parquet"))) or any(
        (d / n).exists() for n in ("spec.yaml", "run_meta.json", "logs", "tune", "fit"))


def _read_parquet(path: Path, aside: bool = True) -> pd.DataFrame | None:
    """The Parquet table at ``path``, or None when it is missing or unreadable; an unreadable one (torn by a crash)
    is moved aside (:func:`loopscale.cluster.storage.move_aside`) unless ``aside`` is False (a folder loopscale did
    not write: its files are left as they are)."""
    if not path.exists():
        return None
    # zoneinfo first: pyarrow imports it converting the zoned timestamps, and a Ctrl-C in that import read as
    # ArrowInvalid ("The zoneinfo module or pytz package must be installed"), the file as torn
    import zoneinfo  # noqa: F401

    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopscale.cluster.storage import move_aside

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as e:  # torn by a crash: moved aside, read as missing
        if aside:
            move_aside(str(path), str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None
    return table.to_pandas()  # (outside the torn-file test: a failure here is not the file's)


def loss_vs_compute_figure(runs: pd.DataFrame, analysis: dict) -> Any:
    """The figure of :func:`plot_loss_vs_compute` (a matplotlib Figure, or None without ok runs with ``C``; the
    caller saves and closes it). The y-range is the runs' losses padded by 10 % of their span; the law's curves,
    which at the small-C end of a width can reach tens of nats, are clipped to it. At most 5 labelled C ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from loopscale.fit.plots import data_ylim, log_ticks

    ok = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    if ok.empty or "C" not in ok.columns:
        return None
    fits = analysis.get("variants", {})
    names = list(ok["variant"].astype(str).unique()) if "variant" in ok.columns else [None]
    names.sort(key=lambda v: (v != "baseline", list(fits).index(v) if v in fits else len(fits), str(v)))
    markers, styles = ("o", "^", "s", "D", "v", "P"), ("-", "--", ":", "-.")

    def params_of(v):  # a variant's own joint law (a table without variants: the baseline's, or the first fit's)
        f = fits.get(v) or fits.get("baseline") or next(iter(fits.values()), {})
        return (f.get("joint") or {}).get("params")

    rs = sorted(ok["r"].unique())
    fig, axes = plt.subplots(1, len(rs), figsize=(3.4 * len(rs), 3.3), sharey=True, squeeze=False)
    widths = sorted(ok["d_model"].unique()) if "d_model" in ok.columns else [None]
    cmap = plt.get_cmap("viridis")
    law, cgrid = make_law("joint"), np.geomspace(ok["C"].min() / 1.5, ok["C"].max() * 1.5, 60)  # every curve's
    for ax, r in zip(axes[0], rs, strict=True):
        sub = ok[ok["r"] == r]
        for j, v in enumerate(names):
            of_v = sub if v is None else sub[sub["variant"].astype(str) == v]
            params = params_of(v)
            for i, w in enumerate(widths):
                color = cmap(i / max(len(widths) - 1, 1))
                s = of_v if w is None else of_v[of_v["d_model"] == w]
                if s.empty:
                    continue
                ax.scatter(s["C"], s["final_val_loss"], s=16, color=color, marker=markers[j % len(markers)], zorder=3)
                if params and "phi" in params:
                    # one curve per model: a unique-depth ladder puts plain models of several depths at one width
                    for _, m in s.groupby(["N_once", "N_rec"], sort=True):
                        f_tok = float((m["C"] / m["D"]).median())
                        cols = {k: np.full(cgrid.size, float(m[k].iloc[0])) for k in ("N_once", "N_rec", "r")}
                        pred = law.predict(params, {**cols, "D": cgrid / f_tok})
                        ax.plot(cgrid, pred, color=color, lw=1, alpha=0.8, ls=styles[j % len(styles)])
        ax.set_xscale("log")
        ax.set_xlim(ok["C"].min() / 1.5, ok["C"].max() * 1.5)
        log_ticks(ax.xaxis)
        ax.set_title(f"r = {r}")
        ax.set_xlabel("C (training FLOPs)")
        ax.grid(alpha=0.3)
    data_ylim(axes[0][0], ok["final_val_loss"])  # shared y: the data's range, not the curves'
    axes[0][0].set_ylabel("validation loss (nats/token)")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=cmap(i / max(len(widths) - 1, 1)), marker="o", ls="", label=f"d={w}")
               for i, w in enumerate(widths) if w is not None]  # fmt: skip
    if len(names) > 1:  # each variant its marker, and its own law's curves their line style
        handles += [Line2D([], [], color="0.4", marker=markers[j % len(markers)], ls=styles[j % len(styles)],
                           label=str(v)) for j, v in enumerate(names)]  # fmt: skip
    if handles:
        axes[0][-1].legend(handles=handles, fontsize=7)
    fig.suptitle("loss vs compute per r (points: runs; lines: joint law per model"
                 + (", each variant its own)" if len(names) > 1 else ")"))
    fig.tight_layout()
    return fig


def plot_loss_vs_compute(runs: pd.DataFrame, analysis: dict, path: Path) -> Path | None:
    """Final validation loss (nats/token) vs training compute C (FLOPs), one panel per r, points coloured by width
    (and marked by variant, whose curves take its own joint law and a line style of their own),
    with the joint law's prediction for every model (width, and depth where a ladder has several) as a curve over C (IsoFLOP style, paper Fig. 2), clipped to
    the data's loss range (:func:`loss_vs_compute_figure`). None (nothing written) without ok runs with ``C``."""
    fig = loss_vs_compute_figure(runs, analysis)
    if fig is None:
        return None
    import matplotlib.pyplot as plt  # after the figure: it selected the Agg backend

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _is_fitted(f: dict) -> bool:
    """A fit record that holds a fit: outcome ``fitted``, or (analysis files written before outcomes were
    recorded) parameters and no outcome."""
    if "outcome" in f:
        return f["outcome"] == FitOutcome.FITTED
    return "params" in f


def _resampling(boot: dict) -> str:
    """How the bootstrap resampled, in words."""
    if boot.get("cell_means"):
        return (f"seeds resampled within cells {tuple(boot.get('stratify_by') or ())}, the law refitted to each "
                "draw's cell means")  # fmt: skip
    if boot.get("stratify_by"):
        return f"runs resampled within cells {tuple(boot['stratify_by'])}"
    return f"block bootstrap over {boot.get('block_by')}"


def fitted_points(v: dict, j: dict) -> str:
    """What the joint fit was fitted to: runs, or cell means of runs; for runs in cells of unequal size
    (``uneven_seeds``, :func:`loopscale.fit.analysis.uneven_seeds`), that cells with more runs weigh more."""
    ft = v.get("fitted_to") or {}
    if ft.get("what") == "cell_means":
        return f"{ft['cells']} cell means of {ft['runs']} runs"
    if ft.get("what") == "runs":  # seeds as replicates, but too few cells for the law: the runs, said why
        one_d = bool((v.get("identification") or {}).get("fixed_D"))
        free = JOINT_PARAMS - 2 if one_d else JOINT_PARAMS  # one D: E + B D^-beta is one constant
        held = (f"their {ft['cells']} distinct points pin no parameter down" if ft["cells"] < free else
                f"with one D (E + B D^-beta one constant) their {ft['cells']} distinct points hold its {free} free "
                "parameters (it, A, alpha, phi)")  # fmt: skip
        what = (f"{j['n']} runs (their {ft['cells']} cells are fewer than the law's {JOINT_PARAMS} parameters, so the "
                f"runs are fitted, not the cell means, and {held}; seeds resampled within cells)")
    else:
        what = f"{j['n']} runs"
    if u := v.get("uneven_seeds"):
        what += f"; {uneven_seeds_line(u)}"
    return what


def uneven_seeds_line(u: dict) -> str:
    """In words, :func:`loopscale.fit.analysis.uneven_seeds`'s record: each run is a point and cells hold different
    numbers of runs, so those with more runs weigh more (seeds of a sweep; in an outside table they may be other rows
    of one model, e.g. checkpoints or LR points, which the fit's ``not_replicates`` note names)."""
    lo, hi = u["runs_per_cell"]
    by_r = "; ".join(f"r = {r}: {a}" if a == b else f"r = {r}: {a}-{b}" for r, (a, b) in (u.get("by_r") or {}).items())
    return (f"each run is one point and the {u['cells']} cells hold {lo} to {hi} runs{f' ({by_r})' if by_r else ''}, "
            "so cells with more runs weigh more in the fit")


def _worth_key(key: str) -> tuple[int, int | None, float | None]:
    """A key of a design's ``worth_half_width`` (:func:`loopscale.fit.design._worth_by_r`) as (r, d_model, D): ``"4"``
    where each r has one looped cell, ``"4/32/16384"`` where it has several (d_model and D then None and the D in
    tokens)."""
    r, *rest = str(key).split("/")
    if len(rest) == 2:
        return int(r), int(rest[0]), float(rest[1])
    return int(r), None, None


def _prediction_section(pred: dict, v: dict, sweep_s: float | None = None) -> list[str]:
    """Predicted (``loopscale design --out``) next to achieved half-widths: phi's bootstrap interval and each looped
    model's worth in unique layers, and the predicted training time beside the sweep stage's wall time ``sweep_s``
    (s; ``run_meta.json``'s, when recorded). The candidate is the spec the design was given, or, where the folder
    took the same spec with another candidate's seeds (``folder_seeds_per_r``, keyed by ``str(r)``, which
    :func:`loopscale.sweep.spec.record_folder_spec` adds), that candidate; no section when no simulated candidate
    has those seeds."""
    cands = pred.get("candidates") or []
    counts = pred.get("folder_seeds_per_r")
    if counts is None:
        cand = next((c for c in cands if c.get("spec_as_written")), None)
    else:
        cand = next((c for c in cands if c.get("seeds_per_r") == counts and not c.get("refused")), None)
    if cand is None:
        return []
    j = v.get("joint") or {}
    lo_hi = (j.get("ci") or {}).get("phi")
    rows = [("φ (joint fit)", cand.get("phi_half_width"),
             (lo_hi[1] - lo_hi[0]) / 2 if lo_hi and None not in lo_hi else None)]  # fmt: skip
    ladder = v.get("ladder") or []
    for key, hw in sorted((cand.get("worth_half_width") or {}).items(), key=lambda kv: _worth_key(kv[0])):
        r, d, D = _worth_key(key)  # "r", or "r/d_model/D" where the design has several looped cells at one r
        w = next((w for w in ladder if int(w["r"]) == r and (d is None or (int(w["d_model"]) == d and
                  math.isclose(float(w["D"]), D, rel_tol=1e-5)))), None)  # fmt: skip
        got = (w["worth_hi"] - w["worth_lo"]) / 2 if w and w.get("worth_lo") is not None else None
        where = "" if d is None else f" (d_model {d}, D {D:g})"
        rows.append((f"worth in unique layers, r = {r}{where}", hw, got))
    L = [
        "\n### Predicted and achieved precision\n",
        f"`loopscale design` predicted these 95 % half-widths from the pilot `{pred.get('pilot')}` "
        f"({cand.get('n_sim')} simulated draws of this design; its training time: {_fmt(cand.get('wall_min'), 3)} "
        "min" + (f", against {sweep_s / 60:.3g} min of this folder's sweep stage, Ray's start-up and the recording of "
                 "the runs included" if isinstance(sweep_s, int | float) else "") + ").\n",
        *(f"> **The design warned:** {w}\n" for w in pred.get("warnings") or []),
        "| quantity | predicted half-width | achieved half-width | achieved / predicted |",
        "|---|---|---|---|",
    ]
    for name, p_, a_ in rows:
        ratio = a_ / p_ if p_ and a_ is not None else None
        L.append(f"| {name} | {_fmt(p_, 3)} | {_fmt(a_, 3)} | {_fmt(ratio, 3)} |")
    return L


def _identification_section(v: dict, runs: pd.DataFrame, d: Path | None = None) -> list[str]:
    """Markdown: the identification verdict for phi (loopscale.fit.identify), phi per r, the figures (of the run
    folder ``d``: a missing one is said, :func:`_figure`), the worth of every looped model in unique layers when the
    grid has a ladder, and the seed spread per cell of ``runs`` (the variant's own ok runs)."""
    ident = v.get("identification") or {}
    L: list[str] = []
    if not ident:
        return L
    L.append("\n### Is φ identified?\n")
    from loopscale.fit.identify import stored_headline

    L.append(f"**{stored_headline(ident)}**\n")
    L.append(
        "Rule (`loopscale.fit.identify`): φ is reported only when no fitted parameter (its point estimate) and "
        "no end of φ's interval is on the search-box edge (the other parameters' intervals may reach it: see the "
        "note on the intervals), the profile of the objective in φ rises by at least one run's worth (2/n) at "
        "φ̂ ± 1, and φ fitted from each r against the r = 1 runs (φ_r) has intervals with a common value."
        + (" Every run has the same D: the D-term is a constant folded into E "
           f"(E + B·D^−β = {_fmt(ident.get('E_D'), 4)}), so E, B and β are not identified and not checked."
           if ident.get("fixed_D") else "")
        + (" The runs have two D: the D-term is pinned at those two only ("
           + ", ".join(f"E + B·D^−β = {_fmt(o, 4)} at D = {_fmt(float(d), 4)}"
                       for d, o in ident["D_offsets"].items())
           + "), fewer values than E, B and β, so those three are not identified and not checked."
           if ident.get("D_offsets") else "")
        + "\n"
    )
    if ident.get("per_r"):
        L.append("| r | φ_r | 95 % CI | r^φ_r | on a bound |")
        L.append("|---|---|---|---|---|")
        beside = []  # phi_r outside its own percentile interval (the interval is still the one checked): refits
        few_d = bool(ident.get("fixed_D") or ident.get("D_offsets"))  # E, B, beta not identified: named apart
        d_term_rows = False
        for row in ident["per_r"]:
            lo, hi = row.get("lo"), row.get("hi")
            ci = "–" if lo is None or hi is None else f"[{_fmt(lo, 3)}, {_fmt(hi, 3)}]"
            out_ci = lo is not None and hi is not None and not lo <= float(row["phi"]) <= hi
            if out_ci:
                beside.append(row.get("n_boot"))
            rp = float(row["r"]) ** float(row["phi"])
            bound = [n for n in str(row.get("on_bound") or "").split(",") if n]
            d_term = [n for n in bound if few_d and n in ("E", "B", "beta")]
            bound = [n for n in bound if n not in d_term]
            d_term_rows |= bool(d_term)
            if lo is not None and hi is not None and phi_interval_on_bound(lo, hi):
                bound.append("φ_r interval")  # an end on phi's box: the box, not the data, sets it
            cell = _bound_cell(bound) + (f" (D-term: {', '.join(d_term)} §)" if d_term else "")
            L.append(f"| {row['r']} | {_fmt(row['phi'], 3)} | {ci}{' †' if out_ci else ''} | {_fmt(rp, 3)} | "
                     f"{cell} |")
        if d_term_rows:
            L.append("\n§ A parameter of the D-term E + B·D^−β, which one or two D do not identify (see above): on the "
                     "box edge in that fit, as in many fits of the same quality; the rule does not check it.")
        if beside:
            from loopscale.fit.bootstrapping import estimate_outside_note

            # the fewest refits of those rows decide (an analysis.json written before n_boot was kept: not known)
            known = [int(n) for n in beside if n is not None]
            L.append(f"\n† {estimate_outside_note(min(known) if len(known) == len(beside) else None)}.")
        for r, why in (ident.get("per_r_no_interval") or {}).items():
            L.append(f"\nNo interval for φ_r at r = {r}: {why}; the per-r check is skipped.")
        refits = [int(row["n_boot"]) for row in ident["per_r"]  # the rows with an interval
                  if row.get("n_boot") is not None and row["n_boot"] == row["n_boot"] and row.get("lo") is not None]
        if refits:  # the rule's own bootstrap, smaller than the run's (its intervals move more with the seed)
            from loopscale.fit.identify import RULE_PER_R_B, RULE_PER_R_STARTS

            n = f"{min(refits)}" if min(refits) == max(refits) else f"{min(refits)}–{max(refits)}"
            L.append(f"\nEach φ_r interval rests on {n} bootstrap refits: the identification rule refits at most "
                     f"{RULE_PER_R_B} resamples per r ({RULE_PER_R_STARTS} starts each), whatever the fit's B, so "
                     "these intervals, and a verdict near the check's edge, move more with the bootstrap seed than "
                     "the joint fit's.")
        L.append("")
    lpr = ident.get("law_per_r") or {}
    if "r2" in lpr:
        phis = ", ".join(f"φ_{r} = {_fmt(p, 3)}" for r, p in lpr["phi"].items())
        L.append(
            f"The same law with φ free per r (`joint_per_r`: {phis}), fitted to the same {lpr['n']} points: "
            f"R² = {_fmt(lpr['r2'], 4)} against {_fmt(lpr['r2_one_phi'], 4)} with one φ (largest residual "
            f"{_fmt(lpr['max_abs_residual'], 3)} nats"
            + (f"; the fitted objective, Huber on log loss, {_fmt(lpr['objective'], 4)} against "
               f"{_fmt(lpr['objective_one_phi'], 4)}" if "objective" in lpr else "")
            + ").\n"
        )
    for key, title in (("phi_profile", "profile of the objective in φ"), ("phi_per_r", "φ and r^φ per r")):
        f = (ident.get("files") or {}).get(key)
        if f:
            L.append(_figure(d, f"fit/{f}", title) + "\n")
    ladder = v.get("ladder") or []
    if ident.get("ladder_error"):
        L.append("### Worth in unique layers (the unique-depth ladder)\n")
        L.append(f"No looped model could be placed: {ident['ladder_error']}.\n")
    if ladder:
        L.append("### Worth in unique layers (the unique-depth ladder)\n")
        L.append(
            "Each looped model placed on the line loss = a + b·log L through the plain r = 1 models of the same "
            "width and budget (`loopscale.fit.ladder`); intervals resample the seeds of every model (95 %). Its φ_r "
            "is the φ at which N_once + r^φ·N_rec equals the unique parameters of a plain model of that worth, read "
            "off this line; the φ_r under \"Is φ identified?\" is the joint law's, fitted to each r with the r = 1 runs. The "
            "two read the same runs through different curves (a line in log L, the law's power law in N), so they "
            "differ, and r's order may too.\n"
        )
        power = any("worth_power" in w for w in ladder)  # analysis files written before it have no such column
        L.append("| d | D | r | unique layers | worth (layers) | 95 % CI | "
                 + ("worth, power-law ladder | " if power else "") + "φ_r | 95 % CI | seeds | seed SD (nats) |")
        L.append("|---|---|---|---|---|---|" + ("---|" if power else "") + "---|---|---|---|")
        marks = set()
        for w in ladder:
            inf = [bool(w.get(f"{k}_minus_inf")) for k in ("phi_r", "phi_lo", "phi_hi")]
            phi = ["−∞" if i else _fmt(w.get(k), 3) for i, k in zip(inf, ("phi_r", "phi_lo", "phi_hi"), strict=True)]
            outside = "‡" if w.get("worth_outside_ladder") else ""
            frac = w.get("phi_defined_frac")
            part = "§" if any(inf) and frac is not None and frac < 1 else ""
            marks |= {m for m in (outside, part) if m}
            L.append(
                f"| {w['d_model']} | {_fmt(w['D'])} | {w['r']} | {_fmt(w['layers_unique'], 3)} | "
                f"{_fmt(w['worth_layers'], 3)}{outside} | [{_fmt(w['worth_lo'], 3)}, {_fmt(w['worth_hi'], 3)}] | "
                + (f"{_fmt(w.get('worth_power'), 3)} | " if power else "")
                + f"{phi[0]}{part} | [{phi[1]}, {phi[2]}] | {w['n_seeds']} | {_fmt(w['seed_sd'], 3)} |"
            )
        if power:
            miss = [w.get("ladder_misfit_se") for w in ladder if w.get("ladder_misfit_se") is not None]
            L.append(
                "\nThe intervals are seed noise only; the line's shape is an assumption. A power law through the "
                "same rungs (loss = e + k·N^−c, the joint law's N-term at fixed D) reads each model off the curve "
                "instead (column \"worth, power-law ladder\"): where the rungs curve, the line reads models between "
                "them as worth more layers, so the two readings' difference is a systematic uncertainty the interval "
                "does not include"
                + (f"; the line misses a rung's seed mean by up to {_fmt(max(miss), 3)} of its standard errors."
                   if miss else ".")
            )
        if "‡" in marks:
            L.append("\n‡ The worth, its interval or its power-law reading lies outside the ladder's depths: read off "
                     "the ladder extended beyond its rungs (extrapolated), not between them.")
        if "§" in marks:
            shares = ", ".join(f"r = {w['r']}: {100 * (1 - w['phi_defined_frac']):.0f} %" for w in ladder
                               if w.get("phi_defined_frac") is not None and w["phi_defined_frac"] < 1)  # fmt: skip
            L.append("\n§ φ_r = −∞ where the model is worth no more than its once-used parameters alone "
                     f"(N* ≤ N_once, so no r^φ_r > 0 solves the law); share of bootstrap draws so placed: {shares}.")
        f = (ident.get("files") or {}).get("ladder")
        if f:
            L.append("\n" + _figure(d, f"fit/{f}", "worth in unique layers") + "\n")
    if "seed" in runs.columns and runs["seed"].nunique() > 1:
        ok = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
        keys = [c for c in ("d_model", "r", "n_recur_block", "D") if c in ok.columns]
        sd = ok.groupby(keys)["final_val_loss"].agg(n="count", avg="mean", sd="std").reset_index()
        sd = sd[sd["n"] >= 2]
        if len(sd):
            L.append("### Seed spread per cell (nats/token)\n")
            L.append("| " + " | ".join(keys) + " | seeds | mean | SD |")
            L.append("|" + "---|" * (len(keys) + 3))
            for row in sd.itertuples(index=False):
                vals = [str(getattr(row, k)) for k in keys]
                # the mean to 4 decimals, finer than the SD (0.003-0.02 nats at CPU scale): 1.9995 read "2" at 4
                # significant digits
                L.append(f"| {' | '.join(vals)} | {row.n} | {row.avg:.4f} | {_fmt(row.sd, 3)} |")
            L.append("")
    return L


def _bound_cell(on_bound: Any) -> str:
    """A table cell naming the fitted parameters on the search-box edge (a list, or a comma-separated string as the
    per-r rows store it), or "–" when none is."""
    names = [n for n in (on_bound.split(",") if isinstance(on_bound, str) else on_bound or []) if n]
    return ", ".join(names) if names else "–"


def _unidentified_caveat(what: str, use: str = "these numbers evaluate the law at") -> str:
    """The line that opens a section computed from a phi the identification check did not accept (``use``: what the
    section's numbers, or some of its rows, do with it)."""
    return (f"> **Not a result:** {use} the {what}, which the identification check "
            "(\"Is φ identified?\" above) did not accept; they illustrate the fit, they are not findings about "
            "looping.")  # fmt: skip


def _provenance(meta: dict) -> list[str]:
    """The lines under the title naming the commands of ``run_meta.json``: "Produced by" the command whose fit the
    report shows (``fit_command``), then the command that started the folder and the last one that ran in it when
    they are others, and the versions the fit was made with (``fit_versions``, ``loopscale --version``'s line) when
    recorded. A folder written before ``fit_command`` was recorded: "Produced by" the command that started it, and
    the last one when another."""
    first, last, fit = meta.get("command"), meta.get("last_command"), meta.get("fit_command")
    if not fit:
        return [f"Produced by `{first}`.\n"] * bool(first) + [f"Last continued with `{last}`.\n"] * bool(
            last and last != first
        )
    L = [f"Produced by `{fit}` (the fit shown here).\n"]
    if first and first != fit:
        L.append(f"Started with `{first}`.\n")
    if last and last not in (fit, first):
        L.append(f"Last continued with `{last}`.\n")
    if meta.get("fit_versions"):
        L.append(f"Fitted with {meta['fit_versions']}; each run's versions are in runs.parquet (`versions`).\n")
    return L


def _stale_fit(d: Path, meta: dict) -> str | None:
    """A warning when the fit in ``d/fit`` was made from another runs table: ``run_meta.json`` records the sha256 of
    the ``runs.parquet`` it fitted (``fit_input.runs_sha256``) and today's file has another (runs removed, added or
    replaced since); None when they agree or the folder records no such hash."""
    from loopscale.fit.analysis import file_digest

    fitted = (meta.get("fit_input") or {}).get("runs_sha256")
    if not fitted or file_digest(d / "runs.parquet") == fitted:
        return None
    return (
        "> **Stale fit.** The fit shown here was made from another runs table: runs.parquet changed after the fit "
        f"(sha256 {file_digest(d / 'runs.parquet')[:12]} now, {fitted[:12]} when fitted), so the fit's parameters, "
        "intervals and curves below are those of that table, not of the runs listed. To refit it and redraw this report run "
        f"`{_rerun_line(d)}` (it first trains the spec's runs "
        f"missing from the table); `loopscale fit {shlex.quote(str(d))}` fits the table as it is now, without changing this report.\n"
    )


def _other_fit_rules(ana: dict, runs: pd.DataFrame | None = None) -> str | None:
    """A note when ``analysis.json`` follows other fit rules than this installation's
    (:data:`loopscale.fit.analysis.FIT_RULES_VERSION`; version 1 when it records none) in a way that alters the
    analysis of ``runs`` (:func:`loopscale.fit.analysis.fit_rules_in_effect`): the fits' intervals and verdicts
    may differ from today's. None when they agree."""
    from loopscale.fit.analysis import FIT_RULES_VERSION, fit_rules_in_effect

    made = fit_rules_in_effect(int(ana.get("fit_rules", 1)), runs)
    if made == FIT_RULES_VERSION:
        return None
    return (
        f"> **Made under other fit rules.** The fits shown here follow loopscale's fit rules version {made}; this "
        f"installation applies version {FIT_RULES_VERSION}, whose intervals and verdicts may differ (the README's "
        "\"How the fit works\"). The folder's `loopscale run` command rerun with `--resume` refits it under today's "
        "rules, training nothing (where `run` refuses the folder, e.g. one whose runs an older loopscale defined "
        "otherwise, it names the `loopscale fit` that refits them instead).\n"
    )


def _lost_fit_files(d: Path, ana: dict) -> str | None:
    """A warning when files of the fit that ``analysis.json`` lists are not in ``d/fit`` (a variant's folder
    deleted: :func:`loopscale.fit.analysis.missing_fit_files`), with the command that refits; None when all are
    there."""
    import warnings

    from loopscale.fit.analysis import missing_fit_files

    lost = missing_fit_files(d, ana)
    if not lost:
        return None
    what = ", ".join(f"`{p}`" for p in lost)
    warnings.warn(f"{d}: the fit's files {', '.join(lost)} are missing; the report's numbers are "
                  "fit/analysis.json's, and figures drawn from those files are missing", stacklevel=3)  # fmt: skip
    return (
        f"> **Fit files missing.** {what} are not in the folder: the numbers below are `fit/analysis.json`'s, and "
        f"the figures drawn from those files are missing. `{_rerun_line(d)}` refits (training nothing when every "
        "run is in runs.parquet) and redraws them.\n"
    )


def _json_list_cells(column: pd.Series) -> list[list[str]]:
    """Each non-null cell of a column of JSON lists of strings (the runs' ``warnings``, the LR table's ``notes``),
    as a list; a cell that does not read as one is left out."""
    cells = []
    for text in column.dropna():
        try:
            notes = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(notes, list):
            cells.append([str(n) for n in notes])
    return cells


def lr_study_notes(lr: pd.DataFrame) -> list[str]:
    """What ``tune-lr`` said of its studies, as ``lr_table.parquet``'s ``notes`` column records it (a JSON list per
    row: a chosen LR at the edge of the LRs tried, trials rejected as diverged or not learning), each note once (one
    study's rows share them when its LR serves every r); [] for none or a table written before the column."""
    if "notes" not in lr.columns:
        return []
    return list(dict.fromkeys(n for notes in _json_list_cells(lr["notes"]) for n in notes))


def data_caveat(runs: pd.DataFrame) -> str | None:
    """What the ok runs' own warnings (``warnings``, a JSON list per run) and ``epochs`` say of the data that the
    fitted losses measure, when it is small: the fewest validation tokens any run was evaluated on where the
    validation split held fewer than its ``eval_tokens`` (the trainer's :func:`loopscale.model.data.eval_tokens_note`),
    and the most epochs any run made of its training tokens when above 1 (the data repeated). ``loopscale run``
    prints it under its headline and the report puts it above its sections: a φ fitted to such losses is one of that
    small corpus, however narrow its interval. None when neither holds (or the table lacks both columns)."""
    import re

    ok = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    parts = []
    if "warnings" in ok.columns:
        said = re.compile(r"eval_tokens=(\d+) is more than the validation split holds \((\d+) tokens\): (\d+) tokens")
        short = [(int(m.group(3)), int(m.group(1))) for notes in _json_list_cells(ok["warnings"]) for note in notes
                 if (m := said.search(note))]  # fmt: skip
        if short:
            got, asked = min(short)
            n = len(short)
            parts.append(f"{n} of {len(ok)} ok runs had their validation loss measured on fewer tokens than "
                         f"eval_tokens asks (as few as {got:,} of {asked:,}: the corpus's validation split is smaller)")  # fmt: skip
    if "epochs" in ok.columns and ok["epochs"].notna().any() and float(ok["epochs"].max()) > 1:
        n = int((ok["epochs"] > 1).sum())
        parts.append(f"{n} of {len(ok)} ok runs repeated their training tokens (up to {float(ok['epochs'].max()):.2f} "
                     "epochs)")  # fmt: skip
    if not parts:
        return None
    return ("; ".join(parts) + ". The losses fitted measure that small corpus, so φ and its interval describe it, not "
            "the scaling of a model that keeps seeing new text: give a larger corpus (the dry run's "
            "`corpus_train_tokens` and `epochs_max_run` say how large)")


MIN_TOKENS_PER_PARAM = 10.0
"""Runs that train on fewer tokens per unique parameter (D / N_unique) than this are said to be short
(:func:`training_caveat`, the dry run's ``tokens_per_param_warning``): measured with loopscale's trainer on the cpu
family (docs/looping_at_small_scale/), an r = 2 model (6 unique layers) was worth about 3 plain layers at 10-15
tokens per unique parameter and its own 6 by about 50, so below 10 the looped models' worth, and with it phi, is one
of how far short training got."""

SHORT_TRAINING_WHY = (
    "this early in training a looped model is worth less than it is later (measured on the cpu family in loopscale's "
    "docs/looping_at_small_scale/: an r = 2 model was worth about 3 plain layers at 10-15 tokens per unique parameter "
    "and its own 6 by about 50): phi then describes how far these runs got, not the law of trained models"
)


def short_training(d: np.ndarray, n_unique: np.ndarray, what: str) -> str | None:
    """The sentence on runs of ``d`` tokens and ``n_unique`` unique parameters (shape ``(n,)`` each) that train on
    fewer than :data:`MIN_TOKENS_PER_PARAM` tokens per unique parameter, ``what`` naming them ("ok runs trained",
    "runs would train"); None when none does or ``d`` is empty."""
    d, n_unique = np.asarray(d, dtype=float), np.asarray(n_unique, dtype=float)
    keep = np.isfinite(d) & np.isfinite(n_unique) & (n_unique > 0)
    tpp = d[keep] / n_unique[keep]
    low = tpp < MIN_TOKENS_PER_PARAM
    if not low.any():
        return None
    return (f"{int(low.sum())} of {tpp.size} {what} on fewer than {MIN_TOKENS_PER_PARAM:g} tokens per unique parameter "
            f"(D / N_unique as low as {float(tpp.min()):.2g}, median {float(np.median(tpp)):.3g} over all): "
            f"{SHORT_TRAINING_WHY}; give them more tokens (`tokens`, or larger `budgets`)")  # fmt: skip


def training_caveat(runs: pd.DataFrame) -> str | None:
    """:func:`short_training` of the ok runs of ``runs`` (columns ``D`` and ``N_unique``, else ``N_once`` and
    ``N_rec``): ``loopscale run`` prints it under its headline, ``status`` lists it and the report puts it above its
    sections. None when no ok run is short, or the table lacks the columns."""
    ok = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    if "D" not in ok.columns or not len(ok):
        return None
    if "N_unique" in ok.columns:
        n = ok["N_unique"].to_numpy(dtype=float)
    elif {"N_once", "N_rec"} <= set(ok.columns):
        n = ok["N_once"].to_numpy(dtype=float) + ok["N_rec"].to_numpy(dtype=float)
    else:
        return None
    return short_training(ok["D"].to_numpy(dtype=float), n, "ok runs trained")


def build_report(run_dir: str | Path, redraw_fits: bool = False) -> Path:
    """Write ``run_dir/report.md`` (and ``loss_vs_compute.png``) from the run's files; a report.md edited since
    loopscale wrote it is moved aside first (:func:`keep_an_edited_report`). With ``redraw_fits`` (the
    ``loopscale report`` command) each variant's ``fit_curves.png`` and ``residuals.png`` are drawn again too, from
    its ``fit.json`` and the points it was fitted to (:func:`loopscale.fit.outputs.redraw_fit_figures`; no
    refitting), so a folder written by an earlier version shows today's figures.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist, or ``runs.parquet`` or ``fit/analysis.json`` is missing in it
            (run the sweep / fit stages first).
        ValueError: ``run_dir`` is a file, or not writable.
    """
    d = Path(run_dir)
    if not d.exists():
        raise FileNotFoundError(
            f"folder {d} does not exist: give the output folder of `loopscale run` (its --out)"
        )
    if not d.is_dir():
        raise ValueError(f"{d} is a file: give the output folder of `loopscale run` (or `sweep`)")
    from loopscale.cluster.options import usable_out_dir

    try:  # before anything is read: the report and its figures are written into the folder
        usable_out_dir(d)
    except ValueError:
        raise ValueError(f"{d} is not writable: the report writes report.md and its figures there; give a writable "
                         "folder (e.g. a copy of this one)") from None  # fmt: skip
    torn = (d / "runs.parquet").exists()
    ours = is_loopscale_folder(d)
    runs = _read_parquet(d / "runs.parquet", aside=ours)
    if runs is None and torn and not ours:
        raise FileNotFoundError(
            f"{d / 'runs.parquet'} is not a readable Parquet table, and {d} is not a loopscale output folder (no "
            "spec.yaml, run_meta.json or parts/), so nothing there was changed: give the output folder of "
            "`loopscale run` (its --out)"
        )
    if runs is None and (d / "fit.json").is_file():
        raise FileNotFoundError(
            f"{d} holds a `loopscale fit` output (fit.json), not a run folder: report.md is built for the folder "
            "of a `loopscale run` (its runs, LR table, fits and identification); this fit's numbers are in "
            f"{d / 'fit.json'} (or `loopscale fit TABLE --json`) and its figures are the PNGs there"
        )
    if runs is None:
        raise FileNotFoundError(no_runs_table_message(d, torn))
    from loopscale.cluster.storage import read_json_or_aside
    from loopscale.fit.analysis import variant_frames
    from loopscale.fit.io import drop_duplicate_runs

    # one row per run, the newest, as the fits read them: a run id listed twice (tables concatenated) counted twice
    # in the summary, beside the fits' status counts of one row per run
    runs = drop_duplicate_runs(runs)[0]
    # each variant's ok runs (with the shared r = 1 runs), the rows its fit read (loopscale.fit.analysis.analyze)
    ok_runs = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    frames = variant_frames(ok_runs) if len(ok_runs) and "r" in runs.columns else {}

    ana_path = d / "fit" / "analysis.json"
    ana = read_json_or_aside(str(ana_path))  # an unreadable one is moved aside and counts as missing
    if ana is None and not (d / "spec.yaml").is_file() and not (d / "logs").is_dir():
        raise FileNotFoundError(
            f"{ana_path} not found, and {d} has no spec.yaml: its runs.parquet was not made by `loopscale run` or "
            "`sweep`, and report.md is built only for a run's folder; fit the table with `loopscale fit "
            f"{shlex.quote(str(d / 'runs.parquet'))} --out DIR` (fit.json and figures in DIR; add --bootstrap N --identify for "
            "intervals and the identification verdict)"
        )
    if ana is None and RUN_REFUSES is not None and (why := RUN_REFUSES(d)):  # `run` would refuse what it advises
        raise FileNotFoundError(f"{ana_path} not found, and `loopscale run` cannot make it: {why}")
    if ana is None:
        # a finished run is one of any status but failed (a failed run is trained again): diverged and
        # did_not_learn runs are not, and are counted with the ok ones
        done = runs[runs["status"] != "failed"] if "status" in runs.columns else runs
        kinds = done["status"].value_counts() if "status" in done.columns else None
        how = ("" if kinds is None or set(kinds.index) <= {"ok"} else
               " (" + ", ".join(f"{int(n)} {str(k).replace('_', ' ')}" for k, n in kinds.items()) + ")")  # fmt: skip
        raise FileNotFoundError(
            f"{ana_path} not found: the report is built from the fit stage of `loopscale run`; run it on this "
            f"folder: `{_rerun_line(d)}` (the {len(done)} "
            f"finished runs there{how} are not trained again; runs not finished yet are trained first, then the fit "
            f"stage and the report run; `loopscale status {shlex.quote(str(d))}` says how many are pending)"
        )
    meta = read_json_or_aside(str(d / "run_meta.json")) or {}
    lr = _read_parquet(d / "lr_table.parquet")
    frontier = _read_parquet(d / "fit" / "frontier.parquet")
    iso = _read_parquet(d / "fit" / "isoflop.parquet")
    L: list[str] = []
    title = meta.get("spec_name", d.name)
    L.append(f"# loopscale report: {title}\n")
    L.extend(_provenance(meta))
    stale = _stale_fit(d, meta)
    if stale:
        L.append(stale)
    if other := _other_fit_rules(ana, runs):
        L.append(other)
    if lost := _lost_fit_files(d, ana):
        L.append(lost)
    if small := data_caveat(runs):
        L.append(f"> **Small data.** {small[0].upper()}{small[1:]}.\n")
    if short := training_caveat(runs):
        L.append(f"> **Short training.** {short[0].upper()}{short[1:]}.\n")
    # --- sweep summary
    ok = runs[runs["status"] == "ok"]
    L.append("## Sweep summary\n")
    fitted = f"{', '.join(f'{k}: {v}' for k, v in ana.get('runs_by_status', {}).items())}"
    now = runs["status"].astype("string").fillna("missing").value_counts(sort=False)
    if stale and {k: int(v) for k, v in now.items()} != ana.get("runs_by_status", {}):
        # today's table, beside what the stale fit shown was made from
        L.append(f"- runs: {len(runs)} ({', '.join(f'{k}: {int(v)}' for k, v in now.items())}); the fit shown "
                 f"counted {fitted}")  # fmt: skip
    else:
        L.append(f"- runs: {len(runs)} ({fitted})")
    L.append(
        f"- r values: {sorted(int(x) for x in runs['r'].unique())}; widths d_model: "
        f"{sorted(int(x) for x in runs['d_model'].unique())}"
    )
    if "C" in runs.columns:
        L.append(
            f"- training compute: total {_fmt(float(runs['C'].sum()))} FLOPs; per run "
            f"{_fmt(float(runs['C'].min()))} – {_fmt(float(runs['C'].max()))} FLOPs "
            f"({float(runs['C'].max() / runs['C'].min()):.1f}× span)"
        )
    L.append(f"- tokens per run D: {_fmt(int(runs['D'].min()))} – {_fmt(int(runs['D'].max()))}")
    if opt := _optimizer_line(runs):
        L.append(opt)
    if data := _data_line(runs, _text_column(d)):
        L.append(data)
    if "wall_s" in runs.columns:
        # the members of a seed ensemble share one trial and its wall time: count it once
        walls = runs.groupby("trial_id")["wall_s"].max() if "trial_id" in runs.columns else runs["wall_s"]
        walls = pd.concat([walls, runs.loc[runs["trial_id"].isna(), "wall_s"]]) if "trial_id" in runs else walls
        L.append(
            f"- summed training wall time: {walls.sum() / 60:.1f} min over {len(walls)} trials; "
            f"median tokens/s {_fmt(float(ok['tokens_per_s'].median()) if len(ok) else None)}; "
            f"median MFU {_fmt(float(ok['mfu'].median()) if len(ok) and 'mfu' in ok else None, 3)}"
        )
    for stage, secs in meta.get("stage_wall_s", {}).items():
        if stage != "report":  # a report cannot hold its own build time: `run` and `report` write the same lines
            L.append(f"- stage `{stage}`: {secs / 60:.1f} min wall")
    if ana.get("excluded_runs"):
        from loopscale.fit.io import DUPLICATE_RUN_ID

        n_dup = sum(e.get("reason") == DUPLICATE_RUN_ID for e in ana["excluded_runs"])
        why = [f"status not ok: {len(ana['excluded_runs']) - n_dup}"] if n_dup < len(ana["excluded_runs"]) else []
        if n_dup:
            why.append(f"older rows of a duplicate run_id, the newest row fitted: {n_dup}")
        L.append(f"- excluded from the fits: {len(ana['excluded_runs'])} ({'; '.join(why)})")
        L.append("")
        L.extend(_excluded_table(ana["excluded_runs"]))
    L.append("")
    # --- LR
    if lr is not None and len(lr):
        L.append(f"## Learning rates (stage 1: {_lr_search_name(d)} through Ray Tune, ASHA pruning)\n")
        # with tune_per_r false one study (at the largest r) gives every r its LR: its model's N and loss. A table
        # written before tuned_r was recorded names that r in its study names (<spec>_size<s>_r<r>)
        if "tuned_r" not in lr.columns and "study_name" in lr.columns:
            lr = lr.assign(tuned_r=pd.array(lr["study_name"].map(study_r), dtype="Int64"))
        shared = "tuned_r" in lr.columns and bool((lr["tuned_r"].notna() & (lr["tuned_r"] != lr["r"])).any())
        L.append(
            "| size | r | " + ("tuned at r | N_unique of that model" if shared else "N_unique")
            + " | best LR | best val loss | smoothed LR | table's LR | LR of the runs | trials |"
        )
        L.append("|---|---|---|---|---|---|---|---|---|" + ("---|" if shared else ""))
        unused = 0
        for _, row in lr.sort_values(["size", "r"]).iterrows():
            trained = _run_lrs(runs, row["size"], row["r"], lr)
            unused += bool(trained) and any(not math.isclose(x, float(row["lr"]), rel_tol=1e-9) for x in trained)
            L.append(
                f"| {row['size']} | {row['r']} | " + (f"{_fmt(row.get('tuned_r'))} | " if shared else "")
                + f"{_fmt(row.get('N_unique'))} | {_fmt(row.get('lr_best'))} | "
                f"{_fmt(row.get('best_val_loss'))} | {_fmt(row.get('lr_smoothed'))} | {_fmt(row.get('lr'))} | "
                f"{', '.join(_fmt(x) for x in trained) or '–'} | {_fmt(row.get('n_trials'))} |"
            )
        if unused:
            L.append(
                f"\n**The runs did not use this table** at {unused} of {len(lr)} (size, r): they were trained at the "
                "LR of the last column (a spec with a fixed LR, or a table tuned after the sweep)."
            )
        if said := lr_study_notes(lr):
            L.append("\n**What the LR studies said** (`tune-lr`, recorded in the table's `notes`):\n")
            L.extend(f"- {n}" for n in said)
        pngs = sorted((d / "tune_lr").glob("loss_vs_lr_size*.png")) if (d / "tune_lr").exists() else []
        for p in pngs:
            L.append(f"\n![{p.stem}]({p.relative_to(d)})")
        L.append("")
    elif "lr" in runs.columns:
        L.append("## Learning rates\n")
        L.append(f"Fixed by the spec: {sorted(set(float(x) for x in runs['lr']))}\n")
    if redraw_fits:
        _redraw_fit_figures(d, runs, ana)
    # --- loss vs compute figure
    fig = plot_loss_vs_compute(runs, ana, d / "loss_vs_compute.png")
    if fig:
        L.append("## Loss vs compute\n")
        L.append("![loss vs compute](loss_vs_compute.png)\n")
    several = len(ana.get("variants", {})) > 1
    for vname, v in ana.get("variants", {}).items():
        vf = frames.get(vname)
        own = int((vf["variant"].astype(str) == vname).sum()) if vf is not None and "variant" in vf.columns else None
        if own is not None and own != len(vf) and len(vf) == v.get("n"):  # its fit holds the shared r = 1 runs too
            L.append(f"## Variant `{vname}` ({own} runs, fitted with the {len(vf) - own} shared r = 1 runs)\n")
        else:
            L.append(f"## Variant `{vname}` ({v.get('n')} runs)\n")
        if several and (what := _variant_model_line(runs, vname)):  # what tells the variants apart
            L.append(what + "\n")
        L.append("### Per-r Chinchilla fits (L = E + A·N^−α + B·D^−β, N = unique non-embedding params)\n")
        L.append("| r | A | α | B | β | E | Huber | R² | max abs res | on a bound |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for r, f in v.get("chinchilla_per_r", {}).items():
            if not _is_fitted(f):
                L.append(f"| {r} | skipped: {f.get('skipped', 'not fitted')} |||||||||")
                continue
            p = f["params"]
            L.append(
                f"| {r} | {_fmt(p['A'], 3)} | {_fmt(p['alpha'], 3)} | {_fmt(p['B'], 3)} | {_fmt(p['beta'], 3)} | "
                f"{_fmt(p['E'], 4)} | {_fmt(f['objective'], 3)} | {_fmt(f['r2'], 4)} | "
                f"{_fmt(f['max_abs_residual'], 3)} | {_bound_cell(f.get('on_bound'))} |"
            )
        j = v.get("joint", {})
        if not _is_fitted(j):
            L.append(f"\nJoint fit skipped: {j.get('skipped', 'not fitted')}\n")
            continue
        p, ci = j["params"], j.get("ci", {})
        boot = j.get("bootstrap", {})
        L.append("\n### Joint law (paper Eq. 3): L = E + A·(N_once + r^φ·N_rec)^−α + B·D^−β\n")
        if not phi_identified(v):  # the rule comes before any headline: no bold phi here
            phi_line = (f"Fitted φ̂ = {_fmt(p['phi'], 3)}, bootstrap 95 % CI {_ci(ci, 'phi', 3)}: not a result, φ is "
                        "not identified by this grid (\"Is φ identified?\" below) ")  # fmt: skip
        else:
            phi_line = f"**φ = {_fmt(p['phi'], 3)}, 95 % CI {_ci(ci, 'phi', 3)}** "
        paper = _paper_phi(vname, runs)
        L.append(
            phi_line + f"({_resampling(boot)}, B = {boot.get('B')}, "
            f"{boot.get('n_ok')} refits ok, {boot.get('n_degenerate')} degenerate "
            f"draw{'' if boot.get('n_degenerate') == 1 else 's'} redrawn, "
            f"{boot.get('n_failed')} failed" + (f"; paper: {paper})\n" if paper else ")\n")
        )
        same = ((ana.get("variant_comparison") or {}).get("comparisons") or {}).get(vname, {}).get(
            "same_losses_as_baseline_r")  # fmt: skip
        if same:
            L.append(f"Its runs at r = {', '.join(map(str, same))} ended at the baseline's losses (the Δφ table's ‖): "
                     "there this variant trained the baseline's models, and its φ is theirs.\n")  # fmt: skip
        from loopscale.fit.bootstrapping import (
            box_edge_interval_note,
            estimate_outside_note,
            estimates_outside_ci,
            few_resamples_note,
        )

        if boot.get("no_interval_reason"):
            L.append(f"> **No interval** (every CI below is –): {boot['no_interval_reason']}.\n")
        elif few := few_resamples_note(boot.get("n_ok")):
            L.append(f"> **Warning:** {few}.\n")
        if not boot.get("no_interval_reason") and boot.get("single_seed_note"):
            L.append(f"> **Warning:** {boot['single_seed_note']}.\n")
        L.append("| parameter | value | 95 % CI |")
        L.append("|---|---|---|")
        # analyses written before the list existed: the same test on their params and intervals
        outside = j.get("estimate_outside_ci")
        outside = estimates_outside_ci(p, ci) if outside is None and not boot.get("no_interval_reason") else outside
        for k in ("E", "A", "alpha", "B", "beta", "phi"):
            L.append(f"| {k} | {_fmt(p[k])} | {_ci(ci, k)}{' †' if k in (outside or ()) else ''} |")
        if outside:
            L.append(f"\n† {estimate_outside_note(boot.get('n_ok'))}.")
        mine = frames.get(vname, ok_runs)  # the variant's ok runs, with the shared r = 1 runs
        if (few_d := d_term_unidentified(mine)) is not None:  # E, B, beta: one of many equal fits (and intervals)
            which = (f"one D ({_fmt(float(few_d[0]), 4)} tokens)" if few_d.size == 1 else
                     f"two D ({_fmt(float(few_d[0]), 4)} and {_fmt(float(few_d[1]), 4)} tokens)")  # fmt: skip
            pinned = "is one constant" if few_d.size == 1 else "is pinned at those two only"
            L.append(f"\n> **Note:** the runs have {which}, so the D-term B·D^−β {pinned}: E, B and β are not "
                     "identified (fits of the same quality split E + B·D^−β otherwise), and their values and intervals "
                     "above are one such split, not a measurement; three or more D identify them.")  # fmt: skip
        if not boot.get("no_interval_reason") and (edge := box_edge_interval_note(ci)):
            L.append(f"\n> **Note:** {edge}.")
        # with one or two D, E, B and beta on the box edge say nothing the note above does not (the rule skips them)
        bound = [k for k in j.get("on_bound") or [] if few_d is None or k not in ("E", "B", "beta")]
        d_term = [k for k in j.get("on_bound") or [] if k not in bound]
        L.append(
            f"\nR² = {_fmt(j['r2'], 4)}, RMSE = {_fmt(j['rmse'], 3)} nats, max |residual| = "
            f"{_fmt(j['max_abs_residual'], 3)} nats, Huber objective = {_fmt(j['objective'], 3)}, "
            f"n = {fitted_points(v, j)}, parameters on a bound: "
            + ((", ".join(bound) or "none") if not d_term else
               (f"{', '.join(bound)}; " if bound else "") + f"{', '.join(d_term)} of the D-term (not identified "
               "here: see the note above)")  # fmt: skip
            + "."
        )
        phi_ci = _interval(ci, "phi")
        if phi_ci and phi_interval_on_bound(*phi_ci):
            L.append(
                "\n> **Warning:** the φ interval reaches the search box edge (φ ∈ [−3, 3]): these data do "
                "not identify φ. Widths must straddle the loss-minimising width at each budget, and each "
                "run needs enough tokens per parameter for the N-term to show (README: the fit's limits)."
            )
        if bound:
            L.append(
                "\n> **Warning:** parameters at the search box edge mean the data do not identify them; "
                "treat φ and its interval with care (see the README's section on the fit's limits)."
            )
        L.extend(_identification_section(v, mine, d))
        pred_path = d / "design_prediction.json"
        if vname == "baseline" and pred_path.is_file():
            L.extend(_prediction_section(json.loads(pred_path.read_text(encoding="utf-8")), v,
                                         (meta.get("stage_wall_s") or {}).get("sweep")))  # fmt: skip
        L.append("\nResiduals by r (actual − predicted, nats; paper Table 7):\n")
        L.append("| r | n | mean | max abs | RMSE |")
        L.append("|---|---|---|---|---|")
        for r, s in (j.get("residuals_by_r") or {}).items():
            L.append(
                f"| {r} | {s.get('n')} | {_fmt(s.get('mean'), 3)} | {_fmt(s.get('max_abs'), 3)} | "
                f"{_fmt(s.get('rmse'), 3)} |"
            )
        L.append("\n### Restricted fits\n")
        L.append("| form | α | β | E | φ | R² | Huber | on a bound |")
        L.append("|---|---|---|---|---|---|---|---|")
        L.append(
            f"| φ free | {_fmt(p['alpha'], 3)} | {_fmt(p['beta'], 3)} | {_fmt(p['E'], 4)} | {_fmt(p['phi'], 3)} | "
            f"{_fmt(j['r2'], 4)} | {_fmt(j['objective'], 3)} | {_bound_cell(j.get('on_bound'))} |"
        )
        for name, f in v.get("restricted", {}).items():
            q = f["params"]
            L.append(
                f"| {name} | {_fmt(q['alpha'], 3)} | {_fmt(q['beta'], 3)} | {_fmt(q['E'], 4)} | "
                f"{_fmt(q['phi'], 3)} | {_fmt(f['r2'], 4)} | {_fmt(f['objective'], 3)} | "
                f"{_bound_cell(f.get('on_bound'))} |"
            )
        if any(f.get("on_bound") for f in v.get("restricted", {}).values()):
            L.append(
                "\nA restricted fit with a parameter on the search-box edge is the best the box allows, not an "
                "optimum: compare its R² with care.\n"
            )
        if v.get("equivalence"):
            L.append("\n### What one recurrence is worth here\n")
            if not phi_identified(v):
                L.append(_unidentified_caveat(f"fitted point estimate φ̂ = {_fmt(p['phi'], 3)}") + "\n")
            phi_ci = None if boot.get("no_interval_reason") else _interval(ci, "phi")
            if phi_ci:
                L.append("Intervals: φ's bootstrap interval carried through (r^φ and N_eff rise with φ, so the "
                         "percentile interval of each is r^φ and N_eff at φ's ends).\n")
            from loopscale.fit.derived import equivalence

            for e in v["equivalence"]:
                rp_ci = neff_ci = ""
                if phi_ci:  # the statement's model (its width and r among the fitted runs) at phi's two ends
                    rp_ci = " [" + ", ".join(_fmt(float(e["r"]) ** x, 3) for x in phi_ci) + "]"
                    cell = mine[(mine["r"] == e["r"]) & (mine["d_model"] == e["d_model"])]
                    if len(cell):
                        ends = [equivalence(float(cell["N_once"].iloc[0]), float(cell["N_rec"].iloc[0]), float(e["r"]),
                                            x)["N_eff"] for x in phi_ci]  # fmt: skip
                        neff_ci = " [" + ", ".join(_fmt(x, 3) for x in ends) + "]"
                s = (
                    f"- At r = {e['r']} (d_model {e['d_model']}), a model with N_unique = {_fmt(e['N_unique'], 3)} "
                    f"performs like a non-looped model of N_eff = {_fmt(e['N_eff'], 3)}{neff_ci} (r^φ = "
                    f"{_fmt(e['r_phi'], 3)}{rp_ci})"
                )
                if e.get("flops_per_token") is not None:
                    s += f" and costs {_fmt(e['flops_per_token'], 3)} training FLOPs/token"
                if e.get("flops_per_token_r1") is not None:
                    s += (
                        f", against the r = 1 model of the same width and effective depth: N_unique = "
                        f"{_fmt(e['N_unique_r1'], 3)}, {_fmt(e['flops_per_token_r1'], 3)} FLOPs/token"
                    )
                L.append(s + ".")
        files = v.get("files", {})
        for key, cap in (
            ("phi_bootstrap.png", "φ bootstrap"),
            ("residuals.png", "residuals vs prediction"),
            ("fit_curves.png", "data and fitted curves"),
        ):
            if key in files:
                rel = files[key] if files[key].startswith("fit/") else f"fit/{files[key]}"
                L.append("\n" + _figure(d, rel, cap))
        L.append("")
    # a variant of one D has no frontier (B and beta not identified); analysis files written before it was said
    # keep their frontier rows, which are left out here for the same reason
    no_frontier = _frontier_not_identified(ana, frames)
    if frontier is not None and len(frontier) and "variant" in frontier:
        frontier = frontier[~frontier["variant"].astype(str).isin(no_frontier)]
    has_rows = frontier is not None and len(frontier) > 0
    if no_frontier or has_rows:
        L.append("## Compute-optimal frontier of the joint law (per r)\n")
    for name, why in no_frontier.items():
        L.append(f"Not computed for {name}: {why}.\n")
    if has_rows:
        shown = [str(x) for x in dict.fromkeys(frontier["variant"])] if "variant" in frontier else []
        unid = [x for x in shown if not phi_identified(ana.get("variants", {}).get(x) or {})]
        if unid:
            which = "" if unid == shown else f" (variant{'s' if len(unid) > 1 else ''} {', '.join(unid)})"
            L.append(_unidentified_caveat(f"fitted point estimate of φ{which}") + "\n")
        L.append("| variant | C (FLOPs) | r | N* (unique) | N_eff* | D* (tokens) | L* (nats) |")
        L.append("|---|---|---|---|---|---|---|")
        edge = frontier["at_search_edge"].fillna(False).astype(bool) if "at_search_edge" in frontier else None
        trained = _trained_ranges(frames)  # per variant: the (N_unique, D) ranges its ok runs span
        beyond = []
        for i, row in frontier.sort_values(["variant", "C", "r"]).iterrows():
            mark = "†" if edge is not None and edge.loc[i] else ""
            rng = trained.get(str(row.get("variant", "baseline")))
            n_out = rng is not None and not rng["N"][0] * (1 - 1e-9) <= row["N_star"] <= rng["N"][1] * (1 + 1e-9)
            d_out = rng is not None and not rng["D"][0] * (1 - 1e-9) <= row["D_star"] <= rng["D"][1] * (1 + 1e-9)
            if n_out or d_out:
                beyond.append(str(row.get("variant", "baseline")))
            L.append(
                f"| {row['variant']} | {_fmt(row['C'])} | {int(row['r'])} | {_fmt(row['N_star'], 3)}{mark}"
                f"{'‡' if n_out else ''} | {_fmt(row['N_eff_star'], 3)} | {_fmt(row['D_star'], 3)}{'‡' if d_out else ''}"
                f" | {_fmt(row['L_star'], 4)} |"
            )
        if edge is not None and edge.any():
            L.append("\n† N* on an end of the searched range (1e3 .. 1e15 unique parameters): the law has no optimum "
                     "inside it at that budget, so that row is the range's end, not a compute-optimal model.")
        if beyond:
            spans = "; ".join(f"{v}: N {_fmt(trained[v]['N'][0], 3)} .. {_fmt(trained[v]['N'][1], 3)} unique "
                              f"parameters, D {_fmt(trained[v]['D'][0], 3)} .. {_fmt(trained[v]['D'][1], 3)} tokens"
                              for v in dict.fromkeys(beyond))  # fmt: skip
            L.append(f"\n‡ outside the sizes or token budgets the grid trained ({spans}): the law extrapolated "
                     "there, not a measured optimum.")
        L.append("")
    if ana.get("budget_kind") == "D":
        L.append("## IsoFLOP parabolas\n")
        L.append(
            "Not computed: this grid uses token budgets (every size trained for the same D), so no cell holds "
            "several sizes at one compute budget. Use `budgets: {C: [sizes]}` in the spec for IsoFLOP cells.\n"
        )
    elif ana.get("budget_kind") == "C" and not _any_parabola(iso):
        L.append("## IsoFLOP parabolas\n")
        L.append(
            "Not computed: no (budget, r) cell of this grid holds 3 or more sizes, and a parabola in log N needs 3 "
            "points. List at least 3 sizes per budget in `budgets: {C: [sizes]}` for IsoFLOP cells.\n"
        )
    if _any_parabola(iso):
        L.append("## IsoFLOP parabolas (approximate)\n")
        L.append(
            "Vertices of a parabola in log N per cell (Chinchilla Approach 2). They are biased even without "
            "noise and are shown for comparison only; the frontier above comes from the law. A vertex outside the "
            "sizes a cell trained is not given (the note says where it fell).\n"
        )
        keys = [c for c in iso.columns if c in ("variant", "budget", "D", "r")]
        noted = "note" in iso.columns  # (an isoflop.parquet of an earlier loopscale has no sizes or notes)
        more = " | sizes | N trained | N vertex | L vertex | note |" if noted else " | N vertex | L vertex |"
        L.append("| " + " | ".join(keys) + " | points" + more)
        L.append("|" + "---|" * (len(keys) + (6 if noted else 3)))
        for _, row in iso.iterrows():
            cells = [_fmt(row[k]) if k != "variant" else str(row[k]) for k in keys] + [str(int(row["n_points"]))]
            if noted:
                cells += [str(int(row["n_sizes"])), f"{row['N_min']:.3g} to {row['N_max']:.3g}"]
            cells += [_fmt(row["N_vertex"], 3), _fmt(row["L_vertex"], 4)]
            if noted:
                cells.append(row["note"] if isinstance(row["note"], str) else "")
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    comp = ana.get("variant_comparison")
    if comp:
        L.append("## Variants: Δφ against the baseline (paired bootstrap)\n")
        if "skipped" in comp:
            L.append(f"Skipped: {comp['skipped']}\n")
        else:
            rows = comp.get("comparisons", {})
            if comp.get("block_by"):
                L.append(f"{comp.get('B')} paired draws of whole cells {tuple(comp['block_by'])}, every variant "
                         "refitted to its runs in the drawn cells.\n")
            elif comp.get("stratify_by"):
                means = comp.get("cell_means") or {}
                to = "its cell means" if means and all(means.values()) else "its points"
                L.append(f"{comp.get('B')} paired draws of the seeds within every cell "
                         f"{tuple(comp['stratify_by'])}, every variant refitted to {to} as in its own fit above; "
                         "the cells are drawn alike for all variants: the same seeds of each cell's runs (and of the "
                         "r = 1 runs they share)"
                         + (f", except in {n} cell{'s' * (n != 1)} whose variants' runs have other seeds (a run "
                            "missing or another seed), drawn for each variant on its own"
                            if (n := int(comp.get("unpaired_cells") or 0)) else "") + ".\n")  # fmt: skip
            # computed from the variants' verdicts (analysis files written before the rows carried the flag too)
            unid = {n: phi_not_identified((comp.get("baseline"), n), ana.get("variants", {})) for n in rows}
            named = list(dict.fromkeys(x for n in rows for x in unid[n]))
            if named:
                s_ = "s" if len(named) > 1 else ""
                which = f"fitted point estimate{s_} of φ (variant{s_} {', '.join(named)})"
                use = ("these numbers are differences involving" if all(unid.values())
                       else "the rows marked \"not a result\" are differences involving")  # fmt: skip
                L.append(_unidentified_caveat(which, use) + "\n")
            L.append("| variant | φ | Δφ | 95 % CI | share of resamples with Δφ ≤ 0 | a result? |")
            L.append("|---|---|---|---|---|---|")
            same = {n: c["same_losses_as_baseline_r"] for n, c in rows.items() if c.get("same_losses_as_baseline_r")}
            for name, c in rows.items():
                verdict = f"not a result: φ not identified ({', '.join(unid[name])})" if unid[name] else "yes"
                if c.get("no_interval"):
                    verdict = f"no interval: {c['no_interval']}" + ("" if verdict == "yes" else f"; {verdict}")
                if name in same:  # not a result either way: the change did not alter training there
                    at = f"the baseline's losses at r = {', '.join(map(str, same[name]))} (‖)"
                    verdict = f"no: {at}" if verdict == "yes" else f"{verdict}; {at}"
                L.append(
                    f"| {name} | {_fmt(c.get('phi'), 3)} | {_fmt(c.get('delta_phi'), 3)} | "
                    f"{_ci({'d': c.get('ci')}, 'd')} | {_fmt(c.get('frac_delta_le_0'), 3)} | {verdict} |"
                )
            from loopscale.fit.variants import SAME_LOSS_RTOL

            for name, rs in same.items():
                why = (" Truncated BPTT on short runs: the loop's state weight W_h starts at zero (W_inject = [I | 0]) "
                       "and is still small, so the gradient through the detached early recurrences is too small to "
                       "change the model; longer runs are needed to measure truncation." if name == "trunc_bptt"
                       else "")  # fmt: skip
                L.append(f"\n‖ **{name} trained the baseline's models at r = {', '.join(map(str, rs))}**: each of its "
                         f"runs there ends at the loss of the baseline's run of the same cell and seed (to "
                         f"{SAME_LOSS_RTOL:g} relative; two seeds differ by ~1 %), so the change made no measurable "
                         f"difference to training at those r, and Δφ cannot show one.{why}")
            L.append("")
    from loopscale.cluster.storage import write_text_atomic

    out = d / "report.md"
    text = with_report_footer("\n".join(L) + "\n")
    keep_an_edited_report(out, text)
    write_text_atomic(str(out), text)
    return out


KEPT_REPORTS = ("report_edited", "report_previous")
"""Name prefixes of the report.md copies :func:`keep_an_edited_report` keeps (``<prefix>_<UTC time>.md``): one
changed since loopscale wrote it, one without a footer."""

REPORT_FOOTER = "<!-- loopscale report; sha256 of the text above: {} -->\n"
"""The last line of a report.md loopscale wrote (an HTML comment: Markdown viewers do not show it). The hash tells
a report left as written, which a rebuild replaces, from one a reader edited, which it keeps
(:func:`keep_an_edited_report`)."""


def with_report_footer(body: str) -> str:
    """``body`` (the report's Markdown, ending in a newline) with :data:`REPORT_FOOTER` appended."""
    import hashlib

    return body + REPORT_FOOTER.format(hashlib.sha256(body.encode("utf-8")).hexdigest())


def keep_an_edited_report(path: Path, new_text: str) -> Path | None:
    """Before ``path`` (a run folder's report.md) is rebuilt as ``new_text``: move it aside beside it, with a
    warning, when it is not as loopscale wrote it; returns where it went, or None (no file, or as written: the
    rebuild replaces it). A reader's notes in report.md were lost on the next ``loopscale report`` or ``run
    --resume``. The file is compared as bytes (an editor's Latin-1 or UTF-16 is an edit too), with CRLF line ends
    read as LF and white space after the footer ignored.

    * With a :data:`REPORT_FOOTER` (the last one in the file): kept as ``report_edited_<UTC time>.md`` when the text
      above it does not hash to it, or when text follows it (notes added at the end).
    * Without one (a report written before loopscale hashed its reports, or someone else's file): kept as
      ``report_previous_<UTC time>.md`` unless it is ``new_text``'s text as it stands before the footer.
    """
    import hashlib
    import os
    import re
    import time
    import warnings

    try:
        old = path.read_bytes().replace(b"\r\n", b"\n")
    except OSError:
        return None
    lead = REPORT_FOOTER.split("{}")[0].encode("utf-8")
    new = new_text.encode("utf-8")
    if old in (new, new[: new.rindex(lead)]):  # as written (or as written before the footer)
        return None
    footers = list(re.finditer(rb"(?:^|\n)" + re.escape(lead) + rb"([0-9a-f]{64}) -->[ \t]*(?:\n|\Z)", old))
    if footers:
        m = footers[-1]
        ends = not old[m.end():].strip()
        if ends and hashlib.sha256(old[: m.start(1) - len(lead)]).hexdigest() == m.group(1).decode():
            return None
        prefix = KEPT_REPORTS[0]
        why = "was changed after loopscale wrote it" if ends else "has text after its loopscale footer (notes added at the end)"
    else:
        prefix = KEPT_REPORTS[1]
        why = ("has no loopscale footer (written before loopscale hashed its reports, or by someone else) and "
               "differs from the report rebuilt now")  # fmt: skip
    stamp, k = time.strftime("%Y%m%dT%H%M%S", time.gmtime()), 1
    aside = path.with_name(f"{prefix}_{stamp}.md")
    while aside.exists():  # two rebuilds in one second keep both
        k += 1
        aside = path.with_name(f"{prefix}_{stamp}_{k}.md")
    os.replace(path, aside)
    warnings.warn(f"{path} {why}: kept as {aside.name}, and report.md is written anew", stacklevel=2)
    return aside


def _trained_ranges(frames: dict[str, pd.DataFrame]) -> dict[str, dict[str, tuple[float, float]]]:
    """``{variant: {"N": (lo, hi), "D": (lo, hi)}}``: the unique parameters (N_once + N_rec) and tokens its ok runs
    (``frames``: :func:`loopscale.fit.analysis.variant_frames` of the ok runs, with the shared r = 1 runs) span,
    against which the frontier's N* and D* are marked as extrapolated."""
    out = {}
    for v, f in frames.items():
        if not {"N_once", "N_rec", "D"} <= set(f.columns):
            return {}
        n = (f["N_once"] + f["N_rec"]).astype(float)
        out[str(v)] = {"N": (float(n.min()), float(n.max())), "D": (float(f["D"].min()), float(f["D"].max()))}
    return out


def _frontier_not_identified(ana: dict, frames: dict[str, pd.DataFrame]) -> dict[str, str]:
    """``{variant: why}`` for the variants whose fit gives no compute-optimal frontier: analysis.json's skipped
    ``frontier`` record, or (files written before it was recorded) a variant whose ok runs (``frames``, as
    :func:`_trained_ranges`) have one D (:func:`loopscale.fit.analysis.frontier_unidentified`)."""
    from loopscale.fit.analysis import frontier_unidentified

    out = {}
    for name, v in (ana.get("variants") or {}).items():
        rec = v.get("frontier") if isinstance(v, dict) else None
        if isinstance(rec, dict) and rec.get("skipped"):
            out[name] = rec["skipped"]
        elif name in frames and "D" in frames[name].columns and (why := frontier_unidentified(frames[name])):
            out[name] = why
    return out


def _run_lrs(runs: pd.DataFrame, size, r, table: pd.DataFrame) -> list[float]:
    """The distinct LRs the runs of ``runs`` at ``size`` were trained with, at ``r`` when the LR ``table`` has rows
    per r (``tune.tune_per_r``), else at every r of that size (a size's one LR applies to all r)."""
    if "lr" not in runs.columns or "size" not in runs.columns:
        return []
    sel = runs["size"] == size
    if "r" in runs.columns and (table["size"] == size).sum() > 1:
        sel &= runs["r"] == r
    return sorted({float(x) for x in runs.loc[sel, "lr"].dropna()})


def report_cmd(
    run_dir: Path = typer.Argument(
        ..., help="Output directory of `loopscale run` (holds runs.parquet, fit/)."
    ),
) -> None:
    """Rebuild DIR/report.md and its figures from the Parquet/JSON files of a run (no refitting).

    A report.md edited since loopscale wrote it is kept beside it as report_edited_<UTC time>.md. Prints the
    report's absolute path (as ``loopscale run`` does), also for a relative DIR."""
    typer.echo(str(build_report(run_dir.expanduser().resolve(), redraw_fits=True)))


def _lr_search_name(d: Path) -> str:
    """How stage 1 searched, from the folder's spec.yaml: "a grid over tune.lr_values" when the spec lists LR
    values, else "Optuna TPE"; "Optuna" when the spec cannot be read."""
    import yaml

    try:
        tune = (yaml.safe_load((d / "spec.yaml").read_text(encoding="utf-8")) or {}).get("tune") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return "Optuna"
    return "a grid over tune.lr_values" if tune.get("lr_values") else "Optuna TPE"


def _optimizer_line(runs: pd.DataFrame) -> str | None:
    """'- optimizer: ...' from the runs' ``optimizer``, ``orthogonalization``, ``batch_tokens``, ``schedule`` and
    ``lr_data_factor`` (``orthogonalization`` and ``lr_data_factor`` are absent or null in tables written before
    they were recorded, when every Muon run used Newton-Schulz and no factor); None when the table has no
    ``optimizer`` column."""
    if "optimizer" not in runs.columns:
        return None

    def values(col: str) -> list:
        return sorted({str(v) for v in runs[col].dropna()}) if col in runs.columns else []

    parts = []
    for opt in values("optimizer"):
        sub = runs[runs["optimizer"].astype("string") == opt]
        orth = []
        if opt != "adamw":  # a muon / muonh run recorded before the column existed orthogonalised with Newton-Schulz
            col = sub["orthogonalization"] if "orthogonalization" in sub else pd.Series(["newton_schulz"])
            orth = sorted({str(v) for v in col.fillna("newton_schulz")})
        how = {"newton_schulz": "Newton–Schulz", "polar_express": "Polar Express"}
        parts.append(opt + (f" ({' / '.join(how.get(o, o) for o in orth)} orthogonalisation)" if orth else ""))
    line = f"- optimizer: {', '.join(parts) or '–'}"
    if sched := values("schedule"):
        line += f"; schedule {', '.join(sched)}"
    if batch := values("batch_tokens"):
        line += f"; batch {', '.join(_fmt(int(float(b))) for b in batch)} tokens"
    if "lr_data_factor" in runs.columns and (f := runs["lr_data_factor"].dropna()).size and (f != 1).any():
        line += (
            f"; the matrix LR of each run is its LR × (D / D_ref)^−exponent (`lr_data_exponent`), a factor "
            f"{float(f.min()):.3g} – {float(f.max()):.3g} (`lr_data_factor` in runs.parquet)"
        )
    return line


def _text_column(d: Path) -> str | None:
    """The Parquet text column the folder's runs read (its ``corpus.json``, written by its first command), when it
    is not the default ``text``; None otherwise or when the file is missing or unreadable."""
    try:
        col = json.loads((d / "corpus.json").read_text(encoding="utf-8")).get("text_column")
    except (OSError, ValueError, AttributeError):
        return None
    return col if isinstance(col, str) and col != "text" else None


def _data_line(runs: pd.DataFrame, text_column: str | None = None) -> str | None:
    """The report's line on what the runs read: corpus (and ``text_column``, a Parquet corpus's column read when it
    is not ``text``), its content hash (sha256, 12 hex digits), tokenizer and vocabulary, sequence length, and the
    most epochs any run made of its training tokens (> 1: the data repeated). Each value is listed once per distinct
    value in ``runs``; columns the table lacks are left out (None when it has none of them)."""

    def values(col: str, fmt=str) -> str | None:
        if col not in runs.columns:
            return None
        vals = sorted({fmt(v) for v in runs[col].dropna()})
        return ", ".join(vals) if vals else None

    parts = []
    if corpus := values("corpus", lambda v: f"`{v}`"):
        sha = values("corpus_sha256", lambda v: str(v)[:12])
        col = f", text column `{text_column}`" if text_column else ""
        parts.append(f"corpus {corpus}{col}" + (f" (corpus_sha256 {sha}: a hash of its files' names and content)"
                                                if sha else ""))
    if tok := values("tokenizer"):
        vocab = values("vocab_size", lambda v: f"{int(v):,}")
        parts.append(f"tokenizer {tok}" + (f" (vocabulary {vocab})" if vocab else ""))
    if seq := values("seq_len", lambda v: str(int(v))):
        parts.append(f"sequence length {seq}")
    if "epochs" in runs.columns and runs["epochs"].notna().any():
        most = float(runs["epochs"].max())
        repeated = " (the data repeated)" if most > 1 else ""
        shown = f"{most:.2f}" if most >= 0.01 else f"{most:.2g}"  # a smoke run's 0.00025 read "0.00"
        parts.append(f"at most {shown} epochs of the training tokens per run{repeated}")
    return "- data: " + "; ".join(parts) if parts else None


def _redraw_fit_figures(d: Path, runs: pd.DataFrame, ana: dict) -> None:
    """Redraw each variant's joint-fit figures (``fit/<variant>/fit_curves.png``, ``residuals.png``) from its
    ``fit.json`` and the points :func:`loopscale.fit.analysis.joint_fit_points` gives (a variant whose points do not
    match its fit, another version's fit rule, keeps them), and its identification figures (``phi_profile.png``,
    ``phi_per_r.png``) from the profile and per-r rows ``analysis.json`` holds, and a missing or unreadable
    ``ladder.png`` from its ladder rows and the runs (:func:`loopscale.fit.analysis.ladder_frames`)."""
    from loopscale.fit.analysis import joint_fit_points, ladder_frames
    from loopscale.fit.identify_plots import plot_ladder, plot_per_r, plot_phi_profile
    from loopscale.fit.outputs import redraw_fit_figures

    points = ladders = None
    for vname, v in ana.get("variants", {}).items():
        ident = v.get("identification") or {}
        drawn = ident.get("files") or {}
        ci = tuple(ident["ci"]) if ident.get("ci") else None
        for rel in drawn.values():  # a variant's folder deleted: drawn again into a new one
            if isinstance(rel, str):
                (d / "fit" / rel).parent.mkdir(parents=True, exist_ok=True)
        if drawn.get("phi_profile") and ident.get("profile") and ident.get("n"):
            plot_phi_profile(pd.DataFrame(ident["profile"]), float(ident["phi"]), ci, int(ident["n"]),
                             d / "fit" / drawn["phi_profile"])  # fmt: skip
        if drawn.get("phi_per_r") and ident.get("per_r"):
            plot_per_r(pd.DataFrame(ident["per_r"]), float(ident["phi"]), ci, d / "fit" / drawn["phi_per_r"])
        if drawn.get("ladder") and v.get("ladder") and not _is_png(d / "fit" / drawn["ladder"]):
            # missing or unreadable: drawn again from analysis.json's ladder rows and the runs they were read from
            ladders = ladder_frames(runs) if ladders is None else ladders
            if vname in ladders:
                plot_ladder(ladders[vname], pd.DataFrame(v["ladder"]), d / "fit" / drawn["ladder"])
        files = v.get("files") or {}
        _redraw_phi_bootstrap(d / "fit", files)
        if "fit.json" not in files or "fit_curves.png" not in files or not (d / "fit" / files["fit.json"]).is_file():
            continue  # (no fit.json: the report names the figures missing, and `run --resume` refits)
        points = joint_fit_points(runs) if points is None else points
        if vname in points:
            redraw_fit_figures(d / "fit" / files["fit.json"], points[vname])


def _redraw_phi_bootstrap(fit_dir: Path, files: dict) -> None:
    """Draw a variant's missing ``phi_bootstrap.png`` again from its ``bootstrap.parquet`` (the draws) and
    ``fit.json`` (phi, its interval and the bootstrap's settings); nothing when it is there or they are not."""
    import types

    from loopscale.fit.plots import plot_phi_bootstrap

    png, draws, fj = (files.get(k) for k in ("phi_bootstrap.png", "bootstrap.parquet", "fit.json"))
    if not (png and draws and fj) or _is_png(fit_dir / png):
        return
    try:
        fit = json.loads((fit_dir / fj).read_text(encoding="utf-8"))
        table = pd.read_parquet(fit_dir / draws)
    except (OSError, ValueError):  # unreadable: the report says the figure is missing
        return
    b = fit.get("bootstrap") or {}
    boot = types.SimpleNamespace(draws=table, ci={k: tuple(v) for k, v in (fit.get("ci") or {}).items() if v},
                                 level=b.get("level", 0.95), B=b.get("B"), block_by=b.get("block_by"),
                                 extra={"stratify_by": b.get("stratify_by")})  # fmt: skip
    plot_phi_bootstrap(boot, fit_dir / png, (fit.get("params") or {}).get("phi"))


def _figure(d: Path | None, rel: str, caption: str) -> str:
    """The Markdown image of ``d/rel``, or where that file is missing (deleted, or never drawn) a line saying so,
    with a warning: a link to nothing showed an empty frame without a word."""
    if d is None or _is_png(d / rel):
        return f"![{caption}]({rel})"
    import warnings

    # there, but not a PNG image (a torn or overwritten file): not linked as a figure either
    state, said, why = (("unreadable", "is not a PNG image", "is not a PNG image") if (d / rel).exists()
                        else ("missing", "is missing", "is not in the folder"))  # fmt: skip
    warnings.warn(f"{d / rel} {said}: report.md names it ({caption}) without the figure; the fit stage draws it "
                  "(a refit redraws it)", stacklevel=2)  # fmt: skip
    return f"*Figure {state}: `{rel}` ({caption}) {why}; the fit stage draws it (a refit redraws it).*"


def _is_png(path: Path) -> bool:
    """``path`` is a file that starts as a PNG image does (its 8-byte signature)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


def _excluded_table(rows: list[dict]) -> list[str]:
    """Markdown table of the runs left out of the fits: each run's cell, its seed, status and reason (the
    trial's last error for a failed run, shortened to its first line; ``duplicate_run_id`` for an older row of a
    run whose newest row is fitted)."""
    cols = [c for c in ("run_id", "variant", "r", "d_model", "n_recur_block", "D", "budget", "seed", "status")
            if any(e.get(c) is not None for e in rows)]
    head = [{"n_recur_block": "layers in block"}.get(c, c) for c in cols] + ["reason"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in rows:
        err = str(e.get("error") or "").strip().splitlines()
        why = e.get("reason", "") + (f": {err[0][:120]}" if err else "")
        cells = ["" if e.get(c) is None else (f"{e[c]:.3g}" if c == "budget" else str(e[c])) for c in cols]
        out.append("| " + " | ".join(cells + [why.replace("|", "/")]) + " |")
    return out
