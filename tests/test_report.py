"""report.md: the sections computed from the law at the fitted phi (what one recurrence is worth, the compute-optimal
frontier) carry a "not a result" line exactly when the identification check did not accept phi."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_cpu_previous_default"
CAVEAT = "> **Not a result:**"


def _section(text: str, heading: str) -> str:
    """The text from ``heading`` to the next heading of any level."""
    start = text.index(heading)
    rest = text[start + len(heading) :]
    nxt = [i for i in (rest.find("\n## "), rest.find("\n### ")) if i >= 0]
    return heading + (rest[: min(nxt)] if nxt else rest)


def _report(tmp_path: Path, ident: dict | None) -> str:
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    if ident is not None:
        ana["variants"]["baseline"]["identification"] = ident
    p.write_text(json.dumps(ana), encoding="utf-8")
    return build_report(run).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "ident,caveat",
    [
        (None, False),  # analysis written before the check existed: unchanged
        ({"identified": True, "headline": "phi = 0.5 [0.4, 0.6] (identified)"}, False),
        (
            {
                "identified": False,
                "headline": "phi not identified by this grid: on the search-box edge: alpha",
            },
            True,
        ),
    ],
)
def test_law_sections_say_not_a_result_exactly_when_phi_is_not_identified(tmp_path, ident, caveat):
    text = _report(tmp_path, ident)
    worth = _section(text, "### What one recurrence is worth here")
    frontier = _section(text, "## Compute-optimal frontier of the joint law (per r)")
    assert "- At r = " in worth and "| baseline |" in frontier  # the numbers are kept either way
    for sec in (worth, frontier):
        body = [line for line in sec.splitlines()[1:] if line.strip()]
        assert body[0].startswith(CAVEAT) == caveat  # the caveat, when there, opens the section
    assert text.count(CAVEAT) == (2 if caveat else 0)
    if caveat:
        assert "fitted point estimate φ̂ = " in worth and "did not accept" in worth
        assert "illustrate the fit" in frontier


def test_phi_identified_reads_the_variant_record():
    from loopscale.fit.run_report import phi_identified

    assert phi_identified({}) and phi_identified({"identification": {}})
    assert phi_identified({"identification": {"identified": True}})
    assert not phi_identified({"identification": {"identified": False}})


def test_lr_section_shows_the_runs_lr_and_says_when_the_table_was_not_used(tmp_path):
    """The LR table of a folder is not always what the runs used (a fixed-LR spec, a tune-lr run afterwards): the
    section shows the runs' own LR next to the table's and says when they differ (it called the table 'LR used')."""
    import pandas as pd

    text = _section(_report(tmp_path, None), "## Learning rates")
    assert "| table's LR | LR of the runs |" in text and "did not use this table" not in text
    assert "| 16 | 4 |" in text and text.count("0.01599") >= 2  # the table's LR and the runs' (size 16)
    runs_path = tmp_path / "run" / "runs.parquet"
    runs = pd.read_parquet(runs_path)
    runs["lr"] = 0.01  # e.g. a spec with lr: {fixed: 0.01} trained in a folder where tune-lr had run
    runs.to_parquet(runs_path)
    from loopscale.fit.run_report import build_report

    text = _section(build_report(tmp_path / "run").read_text(encoding="utf-8"), "## Learning rates")
    assert "**The runs did not use this table** at 12 of 12 (size, r)" in text
    row16 = next(line for line in text.splitlines() if line.startswith("| 16 | 4 |"))
    header = next(line for line in text.splitlines() if line.startswith("| size | r |")).split("|")
    assert row16.split("|")[header.index(" LR of the runs ")].strip() == "0.01"


def test_report_of_a_sweep_folder_or_a_file_says_what_to_run(tmp_path):
    """A folder of `loopscale sweep` has runs but no fit of `loopscale run`: the error gives the command that fits it
    (with the folder's own spec.yaml); a file given as the folder is said to be one."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    shutil.rmtree(run / "fit")
    res = CliRunner().invoke(app, ["report", str(run)])
    assert res.exit_code == 2 and f"loopscale run {run / 'spec.yaml'} --out {run} --resume" in res.output, res.output
    # what --resume does there: it said "the runs there are not trained again: only the fit stage and the report
    # run", also of a folder stopped before its runs finished (they are trained first)
    n_ok = int((pq.read_table(run / "runs.parquet").column("status").to_numpy(zero_copy_only=False) == "ok").sum())
    text = " ".join(res.output.split())
    assert f"the {n_ok} finished runs there are not trained again; runs not finished yet are trained first" in text
    assert "only the fit stage" not in text and f"loopscale status {run}" in text
    # runs that diverged or did not learn finished too (only a failed run is trained again): counted, by status
    runs = pq.read_table(run / "runs.parquet").to_pandas()
    runs.loc[runs.index[:3], "status"] = ["diverged", "did_not_learn", "failed"]
    runs.to_parquet(run / "runs.parquet")
    res = CliRunner().invoke(app, ["report", str(run)])
    text = " ".join(res.output.split())
    assert (f"the {len(runs) - 1} finished runs there ({len(runs) - 3} ok, 1 diverged, 1 did not learn) are not "
            "trained again") in text, text
    res = CliRunner().invoke(app, ["report", str(run / "spec.yaml")])
    assert res.exit_code == 2 and "is a file: give the output folder" in res.output, res.output


def test_seed_spread_of_a_variant_counts_only_its_own_runs(tmp_path):
    """With two variants, each section's seed-spread table holds the cells of that variant's fit: its own looped
    cells and the shared r = 1 cells, 2 seeds each with their own mean (it pooled every variant: 4 'seeds' per
    looped cell, mean and SD between variants)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    base = pq.read_table(run / "runs.parquet").to_pandas()
    parts = []
    for variant, shift in (("baseline", 0.0), ("trunc_bptt", 1.0)):
        for seed, noise in ((0, -0.01), (1, 0.01)):
            df = base.copy() if variant == "baseline" else base[base["r"] > 1].copy()  # r = 1 runs are shared
            df["variant"], df["seed"] = variant, seed
            df["final_val_loss"] = df["final_val_loss"] + shift + noise
            df["run_id"] = df["run_id"] + f"_{variant}_{seed}"
            parts.append(df)
    pq.write_table(pa.Table.from_pandas(pd.concat(parts, ignore_index=True), preserve_index=False),
                   run / "runs.parquet")  # fmt: skip
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    ana["variants"]["baseline"]["identification"] = {"identified": True, "headline": "phi = 0.5 [0.4, 0.6]"}
    ana["variants"]["trunc_bptt"] = ana["variants"]["baseline"]
    p.write_text(json.dumps(ana), encoding="utf-8")
    text = build_report(run).read_text(encoding="utf-8")
    plain = base[(base["d_model"] == 16) & (base["r"] == 1)].sort_values("D").iloc[0]
    looped = base[(base["d_model"] == 16) & (base["r"] == 2)].sort_values("D").iloc[0]
    for variant, shift in (("baseline", 0.0), ("trunc_bptt", 1.0)):
        sec = text[text.index(f"## Variant `{variant}`") :]
        table = _section(sec, "### Seed spread per cell (nats/token)")
        # the shared r = 1 cell (the baseline's runs, in every variant's fit) and the variant's own looped cell
        for cell, want in ((plain, plain["final_val_loss"]), (looped, looped["final_val_loss"] + shift)):
            head = f"| 16 | {cell['r']} | {cell['n_recur_block']} | {cell['D']} |"
            row = next(ln for ln in table.splitlines() if ln.startswith(head))
            cols = [c.strip() for c in row.strip("|").split("|")]
            assert cols[-3] == "2", row
            assert float(cols[-2]) == pytest.approx(want, abs=6e-5), row
            assert len(cols[-2].split(".")[1]) == 4, row  # 4 decimals: a mean of 1.9995 read "2" at 4 digits
            assert float(cols[-1]) == pytest.approx(0.02 / 2**0.5, rel=1e-2), row


def test_sweep_summary_counts_a_run_listed_twice_once(tmp_path):
    """runs.parquet with a run id listed twice (tables concatenated, a rerun's newer row): the summary said 'runs: 51
    (ok: 48)' for 48 runs, its count of rows beside the fits' status counts of one row per run, and summed the
    duplicate's compute twice."""
    import pandas as pd
    import pyarrow as pa

    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    base = pq.read_table(run / "runs.parquet").to_pandas()
    before = _section(build_report(run).read_text(encoding="utf-8"), "## Sweep summary")
    pq.write_table(pa.Table.from_pandas(pd.concat([base, base.iloc[:3]], ignore_index=True), preserve_index=False),
                   run / "runs.parquet")  # fmt: skip
    after = _section(build_report(run).read_text(encoding="utf-8"), "## Sweep summary")
    assert f"- runs: {len(base)} (ok: {len(base)})" in after
    assert after == before


def test_a_rebuilt_report_says_what_the_runs_own_report_says(tmp_path):
    """`loopscale report DIR` on a finished folder added '- stage `report`: 0.0 min wall', which the report `run`
    wrote lacks (it cannot know its own build time): rebuilding with nothing new changed the report. Neither has
    the line now; the other stages' times are kept."""
    import json

    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    meta = json.loads((run / "run_meta.json").read_text(encoding="utf-8"))
    meta["stage_wall_s"] = {"sweep": 600.0, "fit": 60.0, "report": 1.5}
    (run / "run_meta.json").write_text(json.dumps(meta), encoding="utf-8")
    section = _section(build_report(run).read_text(encoding="utf-8"), "## Sweep summary")
    assert "- stage `sweep`: 10.0 min wall" in section and "- stage `fit`: 1.0 min wall" in section
    assert "stage `report`" not in section


def test_excluded_runs_are_a_table_with_their_seeds_and_errors():
    """Two diverged members of one cell differ only in their seed (the report listed raw dicts without it); a
    failed run's reason carries the first line of its error, and a '|' in it does not break the table."""
    from loopscale.fit.run_report import _excluded_table

    base = dict(variant="baseline", r=4, d_model=16, n_recur_block=2, budget=None, D=2048, status="diverged",
                reason="diverged", error=None)  # fmt: skip
    rows = [{**base, "run_id": "c454", "seed": 1}, {**base, "run_id": "c5fc", "seed": 4},
            {**base, "run_id": "dd01", "seed": 0, "status": "failed", "reason": "failed",
             "error": "RuntimeError: out of memory | at step 3\nTraceback ..."}]  # fmt: skip
    lines = _excluded_table(rows)
    assert lines[0] == "| run_id | variant | r | d_model | layers in block | D | seed | status | reason |"
    assert lines[2] == "| c454 | baseline | 4 | 16 | 2 | 2048 | 1 | diverged | diverged |"
    assert lines[3].endswith("| 4 | diverged | diverged |")
    assert lines[4].endswith("| 0 | failed | failed: RuntimeError: out of memory / at step 3 |")
    assert all(ln.count("|") == lines[0].count("|") for ln in lines)


def test_report_marks_an_estimate_outside_its_interval(tmp_path):
    """The joint law's parameter table marks a parameter whose estimate lies outside its bootstrap interval and
    explains the mark once; an analysis written before ``estimate_outside_ci`` existed gets the same mark."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    j = ana["variants"]["baseline"]["joint"]
    b = j["params"]["B"]
    j["ci"]["B"] = [2 * b, 3 * b]
    j["bootstrap"]["no_interval_reason"] = None
    for listed in (None, ["B"]):
        j.pop("estimate_outside_ci", None)
        if listed is not None:
            j["estimate_outside_ci"] = listed
        p.write_text(json.dumps(ana), encoding="utf-8")
        text = build_report(run).read_text(encoding="utf-8")
        rows = [ln for ln in text.splitlines() if ln.startswith("| B |") or ln.startswith("| E |")]
        assert rows[0].endswith("] |") and rows[1].endswith("] † |"), rows
        assert text.count("† estimate outside its bootstrap interval: the data do not pin this parameter down") == 1


def test_report_of_a_missing_folder_says_the_folder_does_not_exist(tmp_path):
    """`loopscale report /nonexistent` blamed a missing runs.parquet; it now says the folder does not exist."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    res = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2 and f"folder {tmp_path / 'nope'} does not exist" in res.output, res.output
    assert "runs.parquet" not in res.output


def test_fits_with_a_parameter_on_the_box_edge_say_so_in_every_table(tmp_path):
    """analysis.json records the parameters each fit left on the search-box edge; the report's restricted-fit,
    per-r Chinchilla and per-r phi tables dropped them (E = 0.0498 = e^-3 read like an estimate)."""
    text = _report(tmp_path, None)
    ana = json.loads((tmp_path / "run" / "fit" / "analysis.json").read_text(encoding="utf-8"))["variants"]["baseline"]
    restricted = _section(text, "### Restricted fits")
    marked = 0
    for name, f in ana["restricted"].items():
        row = next(ln for ln in restricted.splitlines() if ln.startswith(f"| {name} |"))
        want = ", ".join(f["on_bound"]) if f["on_bound"] else "–"
        assert row.rstrip(" |").endswith(want), (row, want)
        marked += bool(f["on_bound"])
    assert marked and "is the best the box allows, not an optimum" in restricted
    chin = _section(text, "### Per-r Chinchilla fits")
    for r, f in ana["chinchilla_per_r"].items():
        if f.get("on_bound") is not None:
            row = next(ln for ln in chin.splitlines() if ln.startswith(f"| {r} |"))
            assert row.rstrip(" |").endswith(", ".join(f["on_bound"]) or "–"), row
    # the per-r phi rows store on_bound as a comma-separated string
    per_r = [{"r": 2, "phi": 0.3, "lo": 0.1, "hi": 0.5, "on_bound": "alpha,E"}, {"r": 4, "phi": 0.4, "lo": None,
             "hi": None, "on_bound": ""}]  # fmt: skip
    text = _report(tmp_path / "b", {"identified": False, "headline": "phi not identified", "per_r": per_r})
    assert "| 2 | 0.3 | [0.1, 0.5] | 1.23 | alpha, E |" in text and "| 4 | 0.4 | – | 1.74 | – |" in text
    # a phi_r interval that ends on phi's box (a new user's hyperconnect phi_2 [0.749, 3] showed only alpha)
    edge = [{"r": 2, "phi": 1.2, "lo": 0.749, "hi": 2.99999, "on_bound": "alpha"}, per_r[1]]
    text = _report(tmp_path / "c", {"identified": False, "headline": "phi not identified", "per_r": edge})
    assert "| 2 | 1.2 | [0.749, 3] | 2.3 | alpha, φ_r interval |" in text
    # the same tolerance as the joint phi's interval in the identification rule (0.1 % of the box's width, 0.006):
    # an end at 2.995 was marked for the joint phi and not for a phi_r (the table's check was 1e-3 in phi)
    from loopscale.fit.identify import phi_interval_on_bound

    near = [{**edge[0], "hi": 2.995}, per_r[1]]
    text = _report(tmp_path / "d", {"identified": False, "headline": "phi not identified", "per_r": near})
    row = next(ln for ln in text.splitlines() if ln.startswith("| 2 | 1.2 |"))
    assert phi_interval_on_bound(0.749, 2.995) and row.endswith("| alpha, φ_r interval |"), row
    assert not phi_interval_on_bound(-2.99, 2.99)


@pytest.mark.parametrize("name", ["example_cpu", "example_cpu_ladder", "example_cpu_previous_default",
                                  "example_cpu_seeds4", *(f"example_cpu/half_seeds/{x}" for x in "abcd")])  # fmt: skip
def test_committed_example_reports_are_what_the_report_command_renders_now(tmp_path, name):
    """The example runs under docs/ show their report.md as `loopscale report DIR` renders it from the committed
    files today: a change to the report (a new column, a caveat) without re-rendering them left readers with
    tables and caveats the tool no longer prints (an 'on a bound' column and the 'Not a result' lines were
    missing, a bootstrap line read 'block bootstrap over None')."""
    from loopscale.fit.run_report import build_report

    src = EXAMPLE.parent / name
    run = tmp_path / "run"
    shutil.copytree(src, run)
    want = (src / "report.md").read_text(encoding="utf-8")
    got = build_report(run).read_text(encoding="utf-8")
    assert got == want, f"docs/{name}/report.md is stale: re-render it with `loopscale report docs/{name}`"


def test_what_one_recurrence_is_worth_sets_a_looped_model_beside_its_iso_depth_r1_partner():
    """With a unique-depth ladder the r = 1 runs have several depths; the statements compared every looped model
    with the first r = 1 row (a 4-layer rung: 1.97e5 FLOPs/token against the looped model's 4.6e5), not with the
    10-layer r = 1 model of the same effective depth (4.57e5)."""
    import pandas as pd

    from loopscale.fit.analysis import _equivalence_statements

    runs = pd.read_parquet(EXAMPLE.parent / "example_cpu" / "runs.parquet")
    iso = runs[(runs["r"] == 1) & (runs["effective_depth"] == 10)].iloc[0]
    assert runs.loc[runs["r"] == 1, "effective_depth"].nunique() > 1  # the ladder
    for e in _equivalence_statements(runs[runs["status"] == "ok"], 0.4):
        assert e["N_unique_r1"] == iso["N_once"] + iso["N_rec"]
        assert e["flops_per_token_r1"] == iso["flops_per_token"]
        assert abs(e["flops_per_token"] / e["flops_per_token_r1"] - 1) < 0.1  # iso-depth: about the same FLOPs
    # a table without layer columns: the r = 1 run nearest in FLOPs/token
    bare = runs[runs["status"] == "ok"].drop(columns=["effective_depth", "n_prelude", "n_recur_block", "n_coda"])
    assert {e["N_unique_r1"] for e in _equivalence_statements(bare, 0.4)} == {iso["N_once"] + iso["N_rec"]}


def test_the_report_carries_the_design_predictions_warnings(tmp_path):
    """A prediction whose design warned (e.g. the pilot does not pin the law down: its half-widths predict nothing)
    was set beside the achieved half-widths with no word of the warning."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE.parent / "example_cpu", run)
    p = run / "design_prediction.json"
    pred = json.loads(p.read_text(encoding="utf-8"))
    assert not pred.get("warnings")
    section = _section(build_report(run).read_text(encoding="utf-8"), "### Predicted and achieved precision")
    assert "The design warned" not in section and "| φ (joint fit) |" in section
    p.write_text(json.dumps({**pred, "warnings": ["the pilot does not pin the law down"]}), encoding="utf-8")
    section = _section(build_report(run).read_text(encoding="utf-8"), "### Predicted and achieved precision")
    assert "> **The design warned:** the pilot does not pin the law down" in section


def test_a_prediction_of_several_looped_cells_per_r_is_matched_cell_by_cell():
    """A design with a ladder at two widths (or budgets) keys its worth half-widths "r/d_model/D"; the report read
    every key as an int, and `run` and `report` of a folder `design --out` wrote ended in "invalid literal for
    int() with base 10: '2/16/16384'", with no report. Each key is now set beside its own cell's achieved
    half-width."""
    from loopscale.fit.run_report import _prediction_section

    pred = {"pilot": "p", "candidates": [{"spec_as_written": True, "n_sim": 20, "wall_min": 1.0, "phi_half_width": 0.2,
                                          "worth_half_width": {"2/16/16384": 0.5, "2/32/16384": 0.25,
                                                               "4/16/1.00045e+06": 1.0}}]}  # fmt: skip
    ladder = [{"r": 2, "d_model": 16, "D": 16384.0, "worth_lo": 3.0, "worth_hi": 4.0},
              {"r": 2, "d_model": 32, "D": 16384.0, "worth_lo": 3.0, "worth_hi": 3.2},
              {"r": 4, "d_model": 16, "D": 1000448.0, "worth_lo": 2.0, "worth_hi": 6.0}]  # fmt: skip
    rows = [ln for ln in _prediction_section(pred, {"joint": {"ci": {"phi": [0.1, 0.5]}}, "ladder": ladder})
            if ln.startswith("| worth")]  # fmt: skip
    assert rows == ["| worth in unique layers, r = 2 (d_model 16, D 16384) | 0.5 | 0.5 | 1 |",
                    "| worth in unique layers, r = 2 (d_model 32, D 16384) | 0.25 | 0.1 | 0.4 |",
                    "| worth in unique layers, r = 4 (d_model 16, D 1.00045e+06) | 1 | 2 | 2 |"], rows  # fmt: skip
    # one looped cell per r: keyed by r, as before
    pred["candidates"][0]["worth_half_width"] = {"4": 1.0, "2": 0.5}
    rows = [ln for ln in _prediction_section(pred, {"joint": {}, "ladder": ladder[1:]}) if ln.startswith("| worth")]
    assert rows == ["| worth in unique layers, r = 2 | 0.5 | 0.1 | 0.2 |",
                    "| worth in unique layers, r = 4 | 1 | 2 | 2 |"], rows  # fmt: skip


def test_the_phi_line_gives_its_interval_to_the_estimates_digits(tmp_path):
    """The joint law's phi line printed the estimate to 3 significant digits and its interval to 4
    ("φ̂ = 0.908, bootstrap 95 % CI [0.846, 0.9881]"); both are to 3 now, as the identification headline."""
    import re

    text = _report(tmp_path, {"identified": False, "headline": "phi not identified by this grid: flat profile"})
    line = next(ln for ln in text.splitlines() if ln.startswith("Fitted φ̂ = "))
    m = re.match(r"Fitted φ̂ = (\S+), bootstrap 95 % CI \[(\S+), (\S+)\]", line)
    assert m, line
    ana = json.loads((EXAMPLE / "fit" / "analysis.json").read_text(encoding="utf-8"))
    joint = ana["variants"]["baseline"]["joint"]
    lo, hi = joint["ci"]["phi"][:2]
    assert m.groups() == (f"{joint['params']['phi']:.3g}", f"{lo:.3g}", f"{hi:.3g}"), line


def test_report_command_redraws_the_fit_figures_from_fit_json(tmp_path):
    """`loopscale report DIR` draws each variant's fit_curves.png and residuals.png again from its fit.json and the
    points the law was fitted to, without refitting (a folder of an earlier version showed figures the tool no
    longer draws: one legend for every panel, overlapping ticks); a fit.json whose parameters do not give its R²
    on those points (another version's fit rule) keeps its figures."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    vdir = run / "fit" / "baseline"
    for name in ("fit_curves.png", "residuals.png"):
        (vdir / name).unlink()
    with pytest.warns(UserWarning, match="is missing"):  # said (below), not drawn:
        build_report(run)  # the run's own report stage: the fit stage has just drawn them
    assert not (vdir / "fit_curves.png").exists()
    build_report(run, redraw_fits=True)
    assert (vdir / "fit_curves.png").stat().st_size > 10_000 and (vdir / "residuals.png").stat().st_size > 10_000
    fit = json.loads((vdir / "fit.json").read_text(encoding="utf-8"))
    fit["params"]["E"] += 0.05  # not the optimum of these points any more: R² differs
    (vdir / "fit.json").write_text(json.dumps(fit), encoding="utf-8")
    for name in ("fit_curves.png", "residuals.png"):
        (vdir / name).unlink()
    with (pytest.warns(UserWarning, match="fit_curves.png is missing: report.md names it"),
          pytest.warns(UserWarning, match="residuals.png is missing: report.md names it")):
        text = build_report(run, redraw_fits=True).read_text(encoding="utf-8")
    assert not (vdir / "fit_curves.png").exists() and not (vdir / "residuals.png").exists()
    # a figure that is not there is said, not linked (a new user's report linked deleted figures without a word)
    assert ("*Figure missing: `fit/baseline/fit_curves.png` (data and fitted curves) is not in the folder; the fit "
            "stage draws it (a refit redraws it).*") in text and "![data and fitted curves]" not in text
    # the identification figures are drawn again from analysis.json's profile and per-r rows
    ident = tmp_path / "ident"
    shutil.copytree(EXAMPLE.parent / "example_cpu", ident)
    drawn = ("phi_profile.png", "phi_per_r.png", "phi_bootstrap.png")  # the last from bootstrap.parquet, fit.json
    for name in drawn:
        (ident / "fit" / "baseline" / name).unlink()
    text = build_report(ident, redraw_fits=True).read_text(encoding="utf-8")
    assert all((ident / "fit" / "baseline" / n).stat().st_size > 10_000 for n in drawn)
    assert "![profile of the objective in φ](fit/baseline/phi_profile.png)" in text and "Figure missing" not in text
    assert "Fit files missing" not in text
    # a figure that is there but is no PNG image (torn, overwritten) was linked as it was; it is said, and drawn
    # again where the report can (ladder.png from analysis.json's ladder rows and the runs)
    for name in ("ladder.png", "phi_bootstrap.png"):
        (ident / "fit" / "baseline" / name).write_text("garbage")
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        text = build_report(ident).read_text(encoding="utf-8")
    assert sorted(str(w.message).split("/")[-1].split(":")[0] for w in said) == [
        "ladder.png is not a PNG image", "phi_bootstrap.png is not a PNG image"]
    assert "*Figure unreadable: `fit/baseline/ladder.png` (worth in unique layers) is not a PNG image" in text
    text = build_report(ident, redraw_fits=True).read_text(encoding="utf-8")
    for name in ("ladder.png", "phi_bootstrap.png"):
        assert (ident / "fit" / "baseline" / name).stat().st_size > 10_000
    assert "Figure unreadable" not in text and "![worth in unique layers](fit/baseline/ladder.png)" in text
    # a variant's whole folder deleted: `loopscale report` stopped with "[Errno 2] No such file or directory:
    # .../phi_profile.png"; it now draws what analysis.json holds, and says which fit files are gone and what refits
    shutil.rmtree(ident / "fit" / "baseline")
    with warnings.catch_warnings(record=True) as said:  # (and each figure it cannot draw: named below)
        warnings.simplefilter("always")
        text = build_report(ident, redraw_fits=True).read_text(encoding="utf-8")
    assert any("the fit's files fit/baseline/fit.json, fit/baseline/bootstrap.parquet are missing" in str(w.message)
               for w in said), [str(w.message) for w in said]  # fmt: skip
    assert (ident / "fit" / "baseline" / "phi_profile.png").stat().st_size > 10_000
    assert (ident / "fit" / "baseline" / "ladder.png").stat().st_size > 10_000
    assert (f"> **Fit files missing.** `fit/baseline/fit.json`, `fit/baseline/bootstrap.parquet` are not in the "
            f"folder: the numbers below are `fit/analysis.json`'s, and the figures drawn from those files are missing. "
            f"`loopscale run {ident / 'spec.yaml'} --out {ident} --resume` refits") in text
    assert "*Figure missing: `fit/baseline/fit_curves.png`" in text


def _with_variant_comparison(tmp_path: Path, verdicts: dict[str, bool], **extra) -> str:
    """The example run with a second variant (`trunc_bptt`, the baseline's record copied) and a Δφ row against the
    baseline, each variant's identification verdict as ``verdicts`` says; the report's Δφ section."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    ana["variants"]["trunc_bptt"] = json.loads(json.dumps(ana["variants"]["baseline"]))
    for name, ok in verdicts.items():
        ana["variants"][name]["identification"] = {
            "identified": ok,
            "headline": "phi = 0.5 [0.4, 0.6] (identified)" if ok else "phi not identified by this grid: flat profile",
        }
    row = {"phi": 0.98, "delta_phi": 0.00276, "ci": [-0.05203, 0.09559], "frac_delta_le_0": 0.35, "n_ok": 20, **extra}
    ana["variant_comparison"] = {"baseline": "baseline", "B": 20, "comparisons": {"trunc_bptt": row}}
    p.write_text(json.dumps(ana), encoding="utf-8")
    return _section(build_report(run).read_text(encoding="utf-8"), "## Variants: Δφ against the baseline")


def test_a_delta_phi_without_an_interval_says_why(tmp_path):
    """A Δφ row whose paired draws all failed (a one-D grid of single runs, blocked by (D, r)) showed "–" for its
    interval and "yes" as a result; it now says there is no interval and why, and how the draws were made."""
    sec = _with_variant_comparison(tmp_path, {"baseline": True, "trunc_bptt": True})
    assert "| trunc_bptt | 0.98 | 0.00276 | [-0.05203, 0.09559] | 0.35 | yes |" in sec
    run = tmp_path / "run"
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    row = {"phi": 0.98, "delta_phi": 0.00276, "ci": [None, None], "frac_delta_le_0": None, "n_ok": 0,
           "no_interval": "every paired draw of cells ('D', 'r') was degenerate"}
    ana["variant_comparison"] = {"baseline": "baseline", "B": 20, "block_by": ["D", "r"], "comparisons": {"trunc_bptt": row}}
    p.write_text(json.dumps(ana), encoding="utf-8")
    from loopscale.fit.run_report import build_report

    sec = _section(build_report(run).read_text(encoding="utf-8"), "## Variants: Δφ against the baseline")
    assert "20 paired draws of whole cells ('D', 'r')" in sec
    assert "| no interval: every paired draw of cells ('D', 'r') was degenerate |" in sec


@pytest.mark.parametrize(
    "verdicts,caveat,cell",
    [
        ({"baseline": True, "trunc_bptt": True}, None, "yes"),
        ({"baseline": True, "trunc_bptt": False}, "(variant trunc_bptt)", "not a result: φ not identified (trunc_bptt)"),
        ({"baseline": False, "trunc_bptt": True}, "(variant baseline)", "not a result: φ not identified (baseline)"),
        ({"baseline": False, "trunc_bptt": False}, "(variants baseline, trunc_bptt)",
         "not a result: φ not identified (baseline, trunc_bptt)"),
    ],
)  # fmt: skip
def test_delta_phi_between_unidentified_phi_is_marked_not_a_result(tmp_path, verdicts, caveat, cell):
    """The Δφ table printed its numbers without a word when the variants' φ were not identified by the grid (the
    frontier of the same report said "Not a result"): a Δφ involving such a φ is now opened by the report's "Not a
    result" line naming the variants, and its row says so."""
    sec = _with_variant_comparison(tmp_path, verdicts)
    body = [line for line in sec.splitlines()[1:] if line.strip()]
    if caveat is None:
        assert CAVEAT not in sec
    else:
        assert body[0].startswith(CAVEAT + " these numbers are differences involving the fitted point estimate")
        assert caveat + ", which the identification check" in body[0] and "not findings" in body[0]
    assert f"| trunc_bptt | 0.98 | 0.00276 | [-0.05203, 0.09559] | 0.35 | {cell} |" in body


def test_analysis_flags_a_delta_phi_between_unidentified_phi(tmp_path, monkeypatch):
    """analysis.json's Δφ rows say whether they are a result: ``identified`` False and ``not_identified`` naming the
    variants whose φ the identification check did not accept (the rows carried Δφ and its interval unflagged)."""
    import pandas as pd

    from loopscale.fit import analysis

    runs = pq.read_table(EXAMPLE / "runs.parquet").to_pandas()
    other = runs[runs["r"] > 1].assign(
        variant="trunc_bptt", run_id=lambda f: f["run_id"] + "_t", final_val_loss=lambda f: f["final_val_loss"] + 0.01
    )
    verdict = {"baseline": True, "trunc_bptt": False}  # the check's, per variant (its folder's name)
    monkeypatch.setattr(
        analysis, "_identification", lambda frame, joint, boot, vdir, *a, **k: ({"identified": verdict[vdir.name]}, [])
    )
    ana = analysis.analyze(pd.concat([runs, other]), tmp_path / "fit", B=3, starts=4, workers=1, plots=False)
    row = ana["variant_comparison"]["comparisons"]["trunc_bptt"]
    assert row["identified"] is False and row["not_identified"] == ["trunc_bptt"] and row["a_result"] is False
    # the Δφ is the difference of the φ the variants' own sections show (here per-run fits: several D, one seed)
    assert ana["variant_comparison"]["block_by"] == ["D", "r"]
    phi = {v: ana["variants"][v]["joint"]["params"]["phi"] for v in ("baseline", "trunc_bptt")}
    assert row["phi"] == pytest.approx(phi["trunc_bptt"], abs=1e-9)
    assert row["delta_phi"] == pytest.approx(phi["trunc_bptt"] - phi["baseline"], abs=1e-9)
    assert json.loads((tmp_path / "fit" / "analysis.json").read_text())["variant_comparison"]["comparisons"][
        "trunc_bptt"
    ]["not_identified"] == ["trunc_bptt"]
    verdict["trunc_bptt"] = True
    ana = analysis.analyze(pd.concat([runs, other]), tmp_path / "fit2", B=3, starts=4, workers=1, plots=False)
    row = ana["variant_comparison"]["comparisons"]["trunc_bptt"]
    assert row["identified"] is True and "not_identified" not in row
    assert row["a_result"] is ("no_interval" not in row)  # both identified, runs that differ: a result with an interval


def test_produced_by_names_the_command_whose_fit_the_report_shows(tmp_path, monkeypatch):
    """`run A --out O`, then `run B --out O --bootstrap 20 --starts 50` (the same grid; only the fit is redone): the
    report said "Produced by `A`" over B's fit. It names the command whose fit it shows, then the one that started
    the folder, and a later command that left the fit as it was."""
    from loopscale.fit import analysis
    from loopscale.fit.run_report import build_report
    from loopscale.sweep import run as run_mod
    from loopscale.sweep.cli import version_line
    from loopscale.sweep.spec import load_spec

    src = EXAMPLE.parent / "example_cpu_seeds4"  # its run ids are today's cells of its spec (the other example's
    out = tmp_path / "O"  # are an older loopscale's, a folder `run` refuses)
    shutil.copytree(src, out)
    for name in ("run_meta.json", "report.md"):  # a folder of the example's spec, no command run in it yet
        (out / name).unlink()
    ana = json.loads((out / "fit" / "analysis.json").read_text(encoding="utf-8"))  # its fit/ stands for each fit:
    (out / "fit" / "analysis.json").write_text(json.dumps({**ana, "fit_rules": analysis.FIT_RULES_VERSION}))  # today's
    spec_path = out / "spec.yaml"
    fits = []
    today = json.loads((out / "fit" / "analysis.json").read_text(encoding="utf-8"))

    def analyze(runs, o, **k):  # the example's fit/ stands for each fit (a refit moves the earlier one aside)
        fits.append(k["B"])
        shutil.copytree(src / "fit", o, dirs_exist_ok=True)  # with its own settings, as analyze writes them
        (o / "analysis.json").write_text(json.dumps({**today, "settings": {k_: k[k_] for k_ in ("B", "starts", "seed")}}))

    monkeypatch.setattr(run_mod, "_grid_done", lambda spec, o: True)  # the example's runs stand for the grid's
    monkeypatch.setattr(analysis, "analyze", analyze)
    a = f"loopscale run my1.yaml --out {out}"
    b = f"loopscale run my1c.yaml --out {out} --bootstrap 20 --starts 50"
    for cmd, B, starts in ((a, 100, 100), (b, 20, 50), (b + " --resume", 20, 50)):
        run_mod.run_pipeline(load_spec(spec_path), out, bootstrap=B, starts=starts, command=cmd, log=lambda s: None)
        head = build_report(out).read_text(encoding="utf-8").split("## Sweep summary")[0]
        lines = [ln for ln in head.splitlines()[1:] if ln]
        assert lines.pop() == f"Fitted with {version_line()}; each run's versions are in runs.parquet (`versions`)."
        assert lines[0].startswith(f"Produced by `{a if cmd == a else b}`"), lines
        if cmd == a:
            assert len(lines) == 1
        else:
            assert lines[0] == f"Produced by `{b}` (the fit shown here)."
            assert lines[1:] == [f"Started with `{a}`."] + [f"Last continued with `{cmd}`."] * (cmd != b)
    assert fits == [100, 20]  # the third command's fit settings were the second's: its fit was not redone
    # kept: the example's own fit/, which no record of this folder names (a refit had written over it), and the
    # first command's fit
    asides = sorted(d for d in out.iterdir() if d.name.startswith("earlier_fit_"))
    assert len(asides) == 2 and [(d / "report.md").is_file() for d in asides] == [False, True]


def test_each_variant_section_says_how_its_looped_runs_were_built(tmp_path):
    """With several variants the report never said what told them apart (injection, lanes, full or truncated
    BPTT): each variant's section now opens with it, read from runs.parquet. A one-variant report has no such line
    (the committed examples render as before)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    base = pq.read_table(run / "runs.parquet").to_pandas()
    assert "Looped runs (r > 1)" not in build_report(run).read_text(encoding="utf-8")
    trunc = base[base["r"] > 1].assign(variant="trunc_bptt", run_id=lambda x: x["run_id"] + "_t")
    trunc["bptt_k"] = (trunc["r"] + 1) // 2
    hyper = base[base["r"] > 1].assign(variant="hyperconnect", injection="hyperconnect", hc_lanes=3,
                                       run_id=lambda x: x["run_id"] + "_h")  # fmt: skip
    pq.write_table(pa.Table.from_pandas(pd.concat([base, trunc, hyper], ignore_index=True), preserve_index=False),
                   run / "runs.parquet")  # fmt: skip
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    for name in ("trunc_bptt", "hyperconnect"):
        ana["variants"][name] = ana["variants"]["baseline"]
    p.write_text(json.dumps(ana), encoding="utf-8")
    text = build_report(run).read_text(encoding="utf-8")
    inj = base.loc[base["r"] > 1, "injection"].iloc[0]
    rs = sorted(int(r) for r in base["r"].unique() if r > 1)
    want = {
        "baseline": f"Looped runs (r > 1): injection {inj}; full backpropagation through time (bptt_k = r).",
        "trunc_bptt": f"Looped runs (r > 1): injection {inj}; truncated backpropagation through time: bptt_k = "
        f"{', '.join(str((r + 1) // 2) for r in rs)} at r = {', '.join(map(str, rs))}.",
        "hyperconnect": "Looped runs (r > 1): injection hyperconnect; K = 3 lanes; full backpropagation through time "
        "(bptt_k = r).",
    }
    for name, line in want.items():
        sec = text[text.index(f"## Variant `{name}`") :].split("\n## ")[0]
        assert line in sec, (name, sec[:400])


def test_a_fit_made_from_another_runs_table_is_called_stale_near_the_top(tmp_path):
    """Runs removed from a finished folder: the report said 'runs: 12 (ok: 16)' and drew the 16-run fit without a
    word. run_meta.json records the sha256 of the runs table the fit was made from; when today's differs the report
    says, under its title, that the fit shown is stale and how to refit, and counts today's runs beside the fit's."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    assert "Stale fit" not in build_report(run).read_text(encoding="utf-8")
    runs = pq.read_table(run / "runs.parquet")
    pq.write_table(runs.slice(4), run / "runs.parquet")
    text = build_report(run).read_text(encoding="utf-8")
    top = text.split("## Sweep summary")[0]
    assert "> **Stale fit.** The fit shown here was made from another runs table: runs.parquet changed" in top
    assert f"`loopscale run {run / 'spec.yaml'} --out {run} --resume`" in top and f"`loopscale fit {run}`" in top
    assert f"- runs: {len(runs) - 4} (ok: {len(runs) - 4}); the fit shown counted ok: {len(runs)}" in text


def test_report_of_a_read_only_folder_says_it_is_not_writable(tmp_path, monkeypatch):
    """A read-only folder ended `loopscale report` in a traceback (PermissionError on its temp file, exit 1); it is
    now refused up front with the check run, sweep and fit --out make (usable_out_dir): 'is not writable', exit 2."""
    import os

    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: (not (mode & os.W_OK) or Path(p) != run)
                        and real(p, mode, *a, **k))  # fmt: skip
    res = CliRunner().invoke(app, ["report", str(run)])
    assert res.exit_code == 2, res.output
    assert f"{run} is not writable" in " ".join(res.output.split()) and "Traceback" not in res.output


def test_report_on_a_fit_folder_or_an_outside_table_says_what_report_is_for(tmp_path):
    """`report` on the --out of `loopscale fit` said runs.parquet was missing ("run loopscale sweep first"); with an
    outside table copied in as runs.parquet it said to run `loopscale run SPEC --out ... --resume`, for a table that
    has no spec. Each now says report.md is for a run's folder and where the fit's own output is."""
    from loopscale.fit.run_report import build_report

    fit_out = tmp_path / "fit_out"
    fit_out.mkdir()
    (fit_out / "fit.json").write_text("{}", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=r"holds a `loopscale fit` output \(fit.json\), not a run folder"):
        build_report(fit_out)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(EXAMPLE / "runs.parquet", outside / "runs.parquet")
    with pytest.raises(FileNotFoundError, match=r"has no spec.yaml: its runs.parquet was not made by `loopscale run`.*"
                       r"`loopscale fit .*runs.parquet --out DIR`"):  # fmt: skip
        build_report(outside)
    # a run folder whose fit stage has not run yet still gets the run --resume advice
    shutil.copy(EXAMPLE / "spec.yaml", outside / "spec.yaml")
    with pytest.raises(FileNotFoundError, match=r"built from the fit stage of `loopscale run`; run it on this folder"):
        build_report(outside)
    assert not (outside / "report.md").exists() and not (fit_out / "report.md").exists()


def test_a_phi_interval_a_hair_short_of_the_box_edge_is_warned_of(tmp_path):
    """The report's φ-interval warning compared with the box's ends to 1e-6 while fit and the identification rule
    take 1e-3 of its width (BOUND_RTOL): an interval ending at 2.999 was warned of by `fit`, failed the rule, and
    got no warning in report.md."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    path = run / "fit" / "analysis.json"
    ana = json.loads(path.read_text(encoding="utf-8"))
    warning = "the φ interval reaches the search box edge"
    for hi, said in ((2.999, True), (2.99, False)):
        ana["variants"]["baseline"]["joint"]["ci"]["phi"] = [0.1, hi]
        path.write_text(json.dumps(ana), encoding="utf-8")
        assert (warning in build_report(run).read_text(encoding="utf-8")) is said, hi


def test_runs_of_few_tokens_per_parameter_get_a_short_training_caution(tmp_path):
    """A grid of runs at 0.1 tokens per parameter got a phi verdict with no word on how short the training was,
    while looped models' worth still grows with training up to ~50 tokens per unique parameter. Runs under 10 are
    now said in the report, by status, under run's headline and in the dry run before anything trains."""
    import pandas as pd

    from loopscale.fit.run_report import build_report, training_caveat
    from loopscale.sweep.presets import preset_spec
    from loopscale.sweep.run import plan
    from loopscale.sweep.status import collect_status, format_status, runs_caveats

    runs = pd.read_parquet(EXAMPLE / "runs.parquet")  # the previous cpu default: 0.9 to 203 tokens per parameter
    short = training_caveat(runs)
    tpp = runs["D"] / runs["N_unique"]
    n = int((tpp < 10).sum())
    assert short.startswith(f"{n} of {len(runs)} ok runs trained on fewer than 10 tokens per unique parameter (D / "
                            f"N_unique as low as {tpp.min():.2g}, median {tpp.median():.3g} over all): ")  # fmt: skip
    assert 0 < n < len(runs) and runs_caveats(EXAMPLE)[1] == short
    assert training_caveat(runs.assign(D=runs["N_unique"] * 10)) is None  # 10 per parameter: not short
    assert training_caveat(runs.assign(status="failed")) is None  # only ok runs count
    assert training_caveat(pd.read_parquet(EXAMPLE.parent / "example_cpu" / "runs.parquet")) is None  # 32 to 160
    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    assert f"> **Short training.** {short[0].upper()}{short[1:]}." in build_report(run).read_text(encoding="utf-8")
    assert f"  (short training: {short})" in format_status(collect_status(run))
    assert plan(preset_spec("smoke"), data=False)["tokens_per_param_warning"].startswith(
        "16 of 16 runs would train on fewer than 10 tokens per unique parameter")
    assert plan(preset_spec("cpu"), data=False)["tokens_per_param_warning"] is None


def test_report_names_the_data_the_runs_read(tmp_path):
    """report.md never named the corpus, its content hash, the tokenizer or whether the data repeated (they were in
    runs.parquet and corpus.json only). The sweep summary now has one line of them."""
    import pandas as pd

    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    runs = pd.read_parquet(run / "runs.parquet")
    runs["corpus_sha256"] = "ab12cd34ef56" + "0" * 52
    runs.loc[runs.index[0], "epochs"] = 2.5
    runs.to_parquet(run / "runs.parquet")
    text = _section(build_report(run).read_text(encoding="utf-8"), "## Sweep summary")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("- data:")]
    assert line == ("- data: corpus `embedded` (corpus_sha256 ab12cd34ef56: a hash of its files' names and content); "
                    "tokenizer byte (vocabulary 256); sequence length 128; at most 2.50 epochs of the training tokens per run (the data repeated)")  # fmt: skip
    runs["epochs"] = 0.00025  # a smoke run's share of the corpus read "at most 0.00 epochs"
    runs.to_parquet(run / "runs.parquet")
    text = _section(build_report(run).read_text(encoding="utf-8"), "## Sweep summary")
    assert "; at most 0.00025 epochs of the training tokens per run" in text
    # a Parquet corpus read from another column than `text` (corpus.json records it): named beside the corpus
    runs["corpus"] = "/data/shards/*.parquet"
    runs.to_parquet(run / "runs.parquet")
    (run / "corpus.json").write_text(json.dumps({"corpus": "/data/shards/*.parquet", "text_column": "content",
                                                 "corpus_sha256": "ab12" + "0" * 60}))  # fmt: skip
    text = _section(build_report(run).read_text(encoding="utf-8"), "## Sweep summary")
    assert "- data: corpus `/data/shards/*.parquet`, text column `content` (corpus_sha256 ab12cd34ef56" in text
    (run / "corpus.json").write_text(json.dumps({"corpus": "/data/shards/*.parquet", "text_column": "text"}))
    assert "text column" not in build_report(run).read_text(encoding="utf-8")


def test_a_one_D_grid_gets_no_frontier_and_says_why(tmp_path):
    """With one token budget B D^-beta is one constant, so the law cannot trade N against D: the frontier followed
    the fitter's split of that constant (docs/example_cpu_seeds4 printed D* = 0.36 tokens; two variants sharing
    the same r = 1 runs gave L* 8.06 and 4.84). The analysis skips it with the reason, and the report says "Not
    computed", also from an analysis written before (its frontier rows are left out)."""
    import pandas as pd

    from loopscale.fit import analysis
    from loopscale.fit.run_report import build_report

    seeds4 = Path(__file__).resolve().parents[1] / "docs" / "example_cpu_seeds4"
    run = tmp_path / "run"
    shutil.copytree(seeds4, run)
    stale = pd.DataFrame({"variant": ["baseline"], "r": [2], "C": [1.1e11], "N_star": [4.88e10], "N_eff_star": [4.35e10],
                          "D_star": [0.379], "L_star": [1.036], "method": ["law"]})  # fmt: skip
    stale.to_parquet(run / "fit" / "frontier.parquet")  # as an older analysis wrote it
    sec = _section(build_report(run).read_text(encoding="utf-8"), "## Compute-optimal frontier of the joint law")
    assert "Not computed for baseline: one token budget (D = 1e+06 tokens)" in sec and "0.379" not in sec
    runs = pq.read_table(seeds4 / "runs.parquet").to_pandas()
    ana = analysis.analyze(runs, tmp_path / "fit", B=0, starts=8, workers=1, plots=False)
    assert ana["variants"]["baseline"]["frontier"]["skipped"].startswith("one token budget")
    assert not (tmp_path / "fit" / "frontier.parquet").exists()
    several = pq.read_table(EXAMPLE / "runs.parquet").to_pandas()  # 4 token budgets: a frontier
    ana = analysis.analyze(several, tmp_path / "fit2", B=0, starts=8, workers=1, plots=False)
    assert "frontier" not in ana["variants"]["baseline"]
    fr = pq.read_table(tmp_path / "fit2" / "frontier.parquet").to_pandas()
    assert len(fr) and "at_search_edge" in fr.columns
    assert "uneven_seeds" not in ana["variants"]["baseline"]  # one run per cell
    # a second seed at r = 2 only: the runs are the points, so those cells weigh twice, which the analysis records
    more = several[several["r"] == 2].assign(seed=1, run_id=lambda f: f["run_id"] + "-s1",
                                             final_val_loss=lambda f: f["final_val_loss"] + 0.01)  # fmt: skip
    ana = analysis.analyze(pd.concat([several, more]), tmp_path / "fit3", B=0, starts=8, workers=1, plots=False)
    u = ana["variants"]["baseline"]["uneven_seeds"]
    assert u["cells"] == 48 and u["runs_per_cell"] == [1, 2] and u["by_r"]["2"] == [2, 2] and u["by_r"]["1"] == [1, 1]


def test_ladder_rows_show_minus_infinity_and_extrapolation(tmp_path):
    """A ladder row whose φ_r is -inf (worth no more than its once-used parameters) showed "–" beside a bounded
    interval that had dropped those draws; it now shows −∞ where the flags say so, the share of such draws, and
    marks a worth read off the ladder's line beyond its rungs."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE.parent / "example_cpu", run)
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    for w in ana["variants"]["baseline"]["ladder"]:  # as an analysis written before the power-law reading
        for key in ("worth_power", "ladder_misfit_se"):
            w.pop(key, None)
    row = ana["variants"]["baseline"]["ladder"][0]
    row.update(phi_r=None, phi_r_minus_inf=True, phi_lo=None, phi_lo_minus_inf=True, phi_hi=-0.26,
               phi_defined_frac=0.43, worth_outside_ladder=True)  # fmt: skip
    p.write_text(json.dumps(ana), encoding="utf-8")
    sec = _section(build_report(run).read_text(encoding="utf-8"), "### Worth in unique layers")
    line = next(x for x in sec.splitlines() if x.startswith(f"| {row['d_model']} |") and f"| {row['r']} |" in x)
    assert "‡ |" in line and "| −∞§ | [−∞, -0.26] |" in line
    assert f"share of bootstrap draws so placed: r = {row['r']}: 57 %" in sec
    assert "‡ The worth, its interval or its power-law reading lies outside the ladder's depths" in sec
    assert "worth, power-law ladder" not in sec  # an analysis written before the power-law reading: no column
    for k, w in enumerate(ana["variants"]["baseline"]["ladder"]):
        w.update(worth_power=4.1 - k, ladder_misfit_se=3.37)
    p.write_text(json.dumps(ana), encoding="utf-8")
    sec = _section(build_report(run).read_text(encoding="utf-8"), "### Worth in unique layers")
    assert "| 95 % CI | worth, power-law ladder | φ_r |" in sec
    line = next(x for x in sec.splitlines() if x.startswith(f"| {row['d_model']} |") and f"| {row['r']} |" in x)
    assert "| 4.1 | −∞§ |" in line
    assert "the line misses a rung's seed mean by up to 3.37 of its standard errors" in sec


def test_a_per_r_phi_without_an_interval_is_said_in_the_report(tmp_path):
    """The identification's per-r rows without an interval showed "–" and no reason: the report now says why."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE.parent / "example_cpu", run)
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    ident = ana["variants"]["baseline"]["identification"]
    for row in ident["per_r"]:
        row.update(lo=None, hi=None)
    ident["per_r_no_interval"] = {"2": "runs resampled one by one: every draw that leaves out one of its 6 blocks "
                                       "holds too few runs"}  # fmt: skip
    p.write_text(json.dumps(ana), encoding="utf-8")
    sec = _section(build_report(run).read_text(encoding="utf-8"), "### Is φ identified?")
    assert "No interval for φ_r at r = 2: runs resampled one by one: every draw that leaves out" in sec
    assert "the per-r check is skipped." in sec


def test_a_per_r_phi_outside_its_interval_is_marked(tmp_path):
    """A percentile interval can lie beside its point (phi_8 = 0.186, [0.206, 3.46]): the per-r table marks such
    a row with † and says what it means, as the joint law's table does; rows inside their interval are unmarked."""
    ident = {"identified": False, "headline": "phi not identified by this grid: phi fitted per r has no common value",
             "per_r": [{"r": 2, "phi": -1.109, "lo": -2.893, "hi": 0.1}, {"r": 8, "phi": 0.186, "lo": 0.2065,
                                                                          "hi": 3.46}]}  # fmt: skip
    text = _report(tmp_path, ident)
    assert "| 2 | -1.11 | [-2.89, 0.1] | " in text
    assert "| 8 | 0.186 | [0.206, 3.46] † | " in text
    assert "\n† estimate outside its bootstrap interval" in text
    inside = {**ident, "per_r": ident["per_r"][:1]}
    assert "† estimate outside its bootstrap interval" not in _report(tmp_path / "b", inside).split("### Is φ")[1]
    # the per-r intervals rest on 40 refits each (`run`'s rule): the note says so rather than naming a basin, as
    # the joint law's does for few resamples; with the analysis's count known and >= 50 it names the basin
    few = {**ident, "per_r": [{**row, "n_boot": 40} for row in ident["per_r"]]}
    text = _report(tmp_path / "c", few)
    assert "\n† estimate outside its bootstrap interval, which rests on 40 refitted resample(s): too few to say" in text
    assert "another basin" not in text.split("### Is φ")[1]
    # and the table says how many refits its intervals rest on, whatever the run's B (it never did)
    assert ("\nEach φ_r interval rests on 40 bootstrap refits: the identification rule refits at most 40 resamples "
            "per r (60 starts each), whatever the fit's B") in text
    assert "Each φ_r interval rests on" not in _report(tmp_path / "e", ident)  # an analysis without the count
    many = {**ident, "per_r": [{**row, "n_boot": 200} for row in ident["per_r"]]}
    assert "(the resamples' fits land in another basin)" in _report(tmp_path / "d", many).split("### Is φ")[1]


def test_the_report_flags_intervals_from_few_resamples(tmp_path):
    """Intervals from fewer than FEW_RESAMPLES refitted resamples get a warning under the joint fit's line; the
    shipped example's 200 do not."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    assert "refitted resample(s)" not in build_report(run).read_text(encoding="utf-8")
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    ana["variants"]["baseline"]["joint"]["bootstrap"]["n_ok"] = 7
    p.write_text(json.dumps(ana), encoding="utf-8")
    assert "> **Warning:** the 95 % intervals rest on 7 refitted resample(s)" in build_report(run).read_text("utf-8")
    # cells left with one seed narrow the intervals: the bootstrap's note is the report's warning too
    assert "cells have one seed" not in build_report(run).read_text("utf-8")
    ana["variants"]["baseline"]["joint"]["bootstrap"]["single_seed_note"] = "3 of 8 cells have one seed (d_model=16)"
    p.write_text(json.dumps(ana), encoding="utf-8")
    assert "> **Warning:** 3 of 8 cells have one seed (d_model=16).\n" in build_report(run).read_text("utf-8")


def test_the_report_says_why_a_seeds_design_is_fitted_to_its_runs():
    """A one-D grid with seeds is fitted to its cell means, except when its cells are fewer than the law's 6
    parameters: then to the runs. `loopscale fit` said so; the report said only 'n = 10 runs'."""
    from loopscale.fit.analysis import SeedReplicates
    from loopscale.fit.run_report import fitted_points

    few = SeedReplicates(("d_model", "r", "layers_unique", "D"), cells=5, runs=10)
    many = SeedReplicates(("d_model", "r", "layers_unique", "D"), cells=8, runs=24)
    assert fitted_points({"fitted_to": few.fitted_to()}, {"n": 10}) == (
        "10 runs (their 5 cells are fewer than the law's 6 parameters, so the runs are fitted, not the cell means, "
        "and their 5 distinct points pin no parameter down; seeds resampled within cells)")  # fmt: skip
    # ... unless every run has one D: E + B D^-beta is then one constant, and 5 points hold the 4 parameters left
    # (the report said they pinned nothing down, while run accepts such a grid)
    one_d = {"fitted_to": few.fitted_to(), "identification": {"fixed_D": True}}
    assert fitted_points(one_d, {"n": 10}) == (
        "10 runs (their 5 cells are fewer than the law's 6 parameters, so the runs are fitted, not the cell means, "
        "and with one D (E + B D^-beta one constant) their 5 distinct points hold its 4 free parameters (it, A, "
        "alpha, phi); seeds resampled within cells)")  # fmt: skip
    three = SeedReplicates(("d_model", "r", "layers_unique", "D"), cells=3, runs=6)
    assert "their 3 distinct points pin no parameter down" in fitted_points(
        {"fitted_to": three.fitted_to(), "identification": {"fixed_D": True}}, {"n": 6})
    assert fitted_points({"fitted_to": many.fitted_to()}, {"n": 8}) == "8 cell means of 24 runs"
    assert fitted_points({}, {"n": 16}) == "16 runs"  # seeds are not replicates (or an analysis without the key)


def test_the_report_names_the_optimizer_its_orthogonalisation_and_the_lr_data_transfer():
    """The sweep summary named no training recipe: a reader could not tell a MuonH / Polar Express grid whose
    Muon LR was transferred per D from an AdamW one. Tables written before the newer columns still summarise."""
    import pandas as pd

    from loopscale.fit.run_report import _optimizer_line

    runs = pd.DataFrame(
        {
            "optimizer": ["muonh"] * 3,
            "orthogonalization": ["polar_express"] * 3,
            "schedule": ["linear"] * 3,
            "batch_tokens": [262144] * 3,
            "lr_data_factor": [1.283, 1.0, 0.6245],
        }
    )
    assert _optimizer_line(runs) == (
        "- optimizer: muonh (Polar Express orthogonalisation); schedule linear; batch 262,144 tokens; the matrix LR "
        "of each run is its LR × (D / D_ref)^−exponent (`lr_data_exponent`), a factor 0.625 – 1.28 "
        "(`lr_data_factor` in runs.parquet)"
    )
    old = pd.DataFrame({"optimizer": ["adamw", "adamw"], "batch_tokens": [1024, 1024]})
    assert _optimizer_line(old) == "- optimizer: adamw; batch 1,024 tokens"
    old = pd.DataFrame({"optimizer": ["muonh"], "orthogonalization": [None], "lr_data_factor": [None]})
    assert _optimizer_line(old) == "- optimizer: muonh (Newton–Schulz orthogonalisation)"  # before the columns
    assert _optimizer_line(pd.DataFrame({"optimizer": ["muon"]})) == "- optimizer: muon (Newton–Schulz orthogonalisation)"
    assert _optimizer_line(pd.DataFrame({"D": [1]})) is None


def test_lr_table_of_a_shared_study_names_the_model_it_tuned_and_a_grid_search_is_called_one(tmp_path):
    """With tune_per_r false one study at the largest r gives every r its LR; the report's row for r = 1 showed
    the r = 8 model's N_unique (9,872) and loss under the heading 'N_unique' as if they were r = 1's. A study
    over tune.lr_values is a grid, not 'Optuna TPE'."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    text = build_report(run).read_text(encoding="utf-8")
    assert "## Learning rates (stage 1: Optuna TPE through Ray Tune, ASHA pruning)" in text
    assert "| size | r | tuned at r | N_unique of that model | best LR |" in text
    assert "| 16 | 1 | 8 | 9,872 | 0.01599 |" in text
    spec = (run / "spec.yaml").read_text(encoding="utf-8")
    (run / "spec.yaml").write_text(spec.replace("tune:\n", "tune:\n  lr_values: [0.002, 0.01, 0.05]\n", 1))
    text = build_report(run).read_text(encoding="utf-8")
    assert "## Learning rates (stage 1: a grid over tune.lr_values through Ray Tune, ASHA pruning)" in text


def test_an_isoflop_grid_without_parabolas_says_why(tmp_path):
    """An iso-FLOP grid of 2 sizes per budget had no 'IsoFLOP parabolas' section at all (a token-budget grid's says
    'Not computed'), though the README lists the section: a parabola needs 3 sizes in a (budget, r) cell."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    assert ana["budget_kind"] == "D" and not (run / "fit" / "isoflop.parquet").exists()
    ana["budget_kind"] = "C"
    p.write_text(json.dumps(ana), encoding="utf-8")
    sec = _section(build_report(run).read_text(encoding="utf-8"), "## IsoFLOP parabolas")
    assert "Not computed: no (budget, r) cell of this grid holds 3 or more sizes" in sec and "token budgets" not in sec



def test_the_isoflop_table_withholds_a_vertex_outside_the_sizes_and_says_why(tmp_path):
    """The report printed a vertex of N = 5.62 parameters for a cell that trained 1.3e4-2.8e5 (the loss rising across
    them all), and a bare '-' for a cell without a minimum. Now each row gives its sizes and a note where it has no
    vertex; an isoflop.parquet of an earlier loopscale (no such columns) renders as before."""
    import numpy as np
    import pandas as pd

    from loopscale.fit import isoflop_parabolas
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    ana["budget_kind"] = "C"
    p.write_text(json.dumps(ana), encoding="utf-8")
    N = np.array([1.3e4, 6.0e4, 2.8e5])
    x = np.log(N)
    df = pd.DataFrame({"budget": np.repeat([1e9, 3e9], 3), "r": 2, "N": [*N, *N],
                       "loss": [*(3.0 + 0.05 * (x - x[1]) ** 2), *(3.0 + 0.1 * (x - x[0]) + 0.01 * (x - x[0]) ** 2)]})  # fmt: skip
    iso = isoflop_parabolas(df)
    iso.insert(0, "variant", "baseline")
    iso.to_parquet(run / "fit" / "isoflop.parquet")
    sec = _section(build_report(run).read_text(encoding="utf-8"), "## IsoFLOP parabolas (approximate)")
    assert "| variant | budget | r | points | sizes | N trained | N vertex | L vertex | note |" in sec
    assert "| baseline | 1.000e+09 | 2 | 3 | 3 | 1.3e+04 to 2.8e+05 | 6e+04 | 3 |  |" in sec, sec
    assert "| baseline | 3.000e+09 | 2 | 3 | 3 | 1.3e+04 to 2.8e+05 | – | – | the loss rises across every size trained" in sec
    iso.drop(columns=["n_sizes", "N_min", "N_max", "note"]).to_parquet(run / "fit" / "isoflop.parquet")
    old = _section(build_report(run).read_text(encoding="utf-8"), "## IsoFLOP parabolas (approximate)")
    assert "| variant | budget | r | points | N vertex | L vertex |" in old and "| baseline | 3.000e+09 | 2 | 3 | – | – |" in old

def test_the_frontier_of_a_token_budget_grid_puts_every_variant_at_the_same_compute_budgets(tmp_path):
    """On a token-budget grid each variant's frontier rows were at 4 budgets spaced over its own runs' C range, so
    no row of one variant could be set beside another's at one C (trunc_bptt from 4.307e8, baseline from 5.576e8).
    They are now spaced over the whole grid's C range."""
    import pandas as pd

    from loopscale.fit import analysis

    runs = pq.read_table(EXAMPLE / "runs.parquet").to_pandas()
    looped = runs[runs["r"] > 1]
    other = looped.assign(variant="trunc_bptt", run_id=looped["run_id"] + "t", C=looped["C"] * 0.8,
                          final_val_loss=looped["final_val_loss"] + 0.01)  # fmt: skip
    both = pd.concat([runs, other], ignore_index=True)
    analysis.analyze(both, tmp_path / "fit", B=0, starts=8, workers=1, plots=False)
    fr = pq.read_table(tmp_path / "fit" / "frontier.parquet").to_pandas()
    cs = {v: sorted(set(g["C"])) for v, g in fr.groupby("variant")}
    assert sorted(cs) == ["baseline", "trunc_bptt"] and cs["baseline"] == cs["trunc_bptt"] and len(cs["baseline"]) == 4
    ok = both[both["status"] == "ok"]
    assert cs["baseline"][0] == pytest.approx(ok["C"].min()) and cs["baseline"][-1] == pytest.approx(ok["C"].max())


def test_a_report_without_a_readable_runs_table_names_what_rebuilds_it(tmp_path):
    """`report` on a torn runs.parquet moved it aside and said "run `loopscale sweep` or `loopscale run` first",
    which trains everything again, also where the runs' own records in parts/ rebuild it; a folder no loopscale
    command wrote got the same line. Each now gets the fix that fits it."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    (run / "runs.parquet").write_bytes((run / "runs.parquet").read_bytes()[:100])  # torn
    with pytest.warns(UserWarning, match="moved aside"), pytest.raises(FileNotFoundError) as e:
        build_report(run)
    msg = str(e.value)
    assert "was unreadable (torn or corrupt) and was moved aside" in msg and "holds no other record" in msg
    assert f"`loopscale run {run / 'spec.yaml'} --out {run} --resume` trains them again" in msg
    assert list(run.glob("runs.parquet.unreadable-*")) and (run / "report.md").is_file()  # kept, not deleted
    (run / "parts" / "runs").mkdir(parents=True)
    shutil.copy(next(run.glob("runs.parquet.unreadable-*")), run / "parts" / "runs" / "abc.parquet")
    with pytest.raises(FileNotFoundError, match=r"not found; its runs' own records are still in .*parts/runs: "
                                                r"`loopscale run .* --resume` rebuilds it from them"):  # fmt: skip
        build_report(run)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not a run")
    with pytest.raises(FileNotFoundError, match="is not a loopscale output folder"):
        build_report(other)
    # an unreadable runs.parquet in a folder no loopscale command wrote is left where it is (it was renamed aside,
    # and the folder then refused as not loopscale's)
    (other / "runs.parquet").write_text("garbage")
    with pytest.raises(FileNotFoundError, match=r"runs.parquet is not a readable Parquet table, and .* is not a "
                                                r"loopscale output folder .*so nothing there was changed"):  # fmt: skip
        build_report(other)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt", "runs.parquet"]
    # a folder `loopscale design --out` prepared: nothing was trained, so nothing is trained "again"
    planned = tmp_path / "planned"
    planned.mkdir()
    shutil.copy(run / "spec.yaml", planned / "spec.yaml")
    (planned / "design_prediction.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as e:
        build_report(planned)
    assert str(e.value) == (f"{planned / 'runs.parquet'} not found: no run of the grid has been trained in {planned} "
                            f"yet (it holds its spec, and a design prediction): `loopscale run {planned / 'spec.yaml'} "
                            f"--out {planned}` trains the grid, fits it and writes the report")  # fmt: skip
    # a folder of `loopscale tune-lr` alone (its logs/ and LR table): nothing of the grid trained either (`run`
    # skips the tuning done); logs/ of another command are a sign of runs, and get the first message
    (planned / "design_prediction.json").unlink()
    (planned / "logs").mkdir()
    (planned / "logs" / "command.json").write_text(json.dumps({"kind": "sweep", "earlier_commands": [{"kind": "tune-lr"}]}))
    pq.write_table(pa.table({"size": [16], "r": [1], "lr": [0.02]}), planned / "lr_table.parquet")
    with pytest.raises(FileNotFoundError, match="holds no other record of its runs"):
        build_report(planned)
    (planned / "logs" / "command.json").write_text(json.dumps({"kind": "tune-lr", "earlier_commands": [{"kind": "tune-lr"}]}))
    with pytest.raises(FileNotFoundError) as e:
        build_report(planned)
    assert str(e.value) == (f"{planned / 'runs.parquet'} not found: no run of the grid has been trained in {planned} "
                            f"yet (it holds its spec, and its LR table): `loopscale run {planned / 'spec.yaml'} "
                            f"--out {planned}` trains the grid, fits it and writes the report")  # fmt: skip


def test_what_one_recurrence_is_worth_carries_phis_interval():
    """The report gave r^phi and N_eff as points only ('r^φ = 0.839'), though fit.json's ci_derived holds their
    intervals; the lines now carry phi's interval through them (both rise with phi), the same as ci_derived's."""
    import re

    text = (EXAMPLE.parent / "example_cpu_seeds4" / "report.md").read_text(encoding="utf-8")
    fit = json.loads((EXAMPLE.parent / "example_cpu_seeds4" / "fit" / "baseline" / "fit.json").read_text())
    lines = [ln for ln in text.splitlines() if ln.startswith("- At r = ")]
    assert len(lines) == 3
    for ln in lines:
        r = int(re.match(r"- At r = (\d+)", ln).group(1))
        lo, hi = (float(x) for x in re.search(r"r\^φ = [-\d.e+]+ \[([-\d.e+]+), ([-\d.e+]+)\]", ln).groups())
        want = fit["ci_derived"][f"r_phi_{r}"]
        assert lo == pytest.approx(want[0], rel=5e-3) and hi == pytest.approx(want[1], rel=5e-3), ln
        assert re.search(r"N_eff = [\d.e+]+ \[[\d.e+]+, [\d.e+]+\]", ln), ln


def test_d_term_parameters_on_the_box_edge_of_a_one_D_grid_raise_no_warning_on_phi():
    """docs/example_cpu_seeds4 (one D, phi identified) has B and E on the box edge: the report warned "treat phi
    and its interval with care" for them, though the rule skips E, B and beta on such a grid (not identified by
    one D, as the note above the line says). They are named apart, without that warning."""
    text = (EXAMPLE.parent / "example_cpu_seeds4" / "report.md").read_text(encoding="utf-8")  # as rendered today:
    # test_committed_example_reports_are_what_the_report_command_renders_now holds it to the report command
    assert "parameters on a bound: B, E of the D-term (not identified here: see the note above)." in text
    assert "treat φ and its interval with care" not in _section(text, "### Joint law")


def test_frontier_values_outside_the_trained_sizes_or_budgets_are_marked():
    """The frontier gave N*, D* and L* beyond the sizes and token budgets the grid trained (a new user's D* was 2.7x
    the largest D, its L* below every measured loss) as if measured; such values are marked ‡ and the range said."""
    text = _section((EXAMPLE / "report.md").read_text(encoding="utf-8"), "## Compute-optimal frontier")
    assert "| baseline | 5.393e+12 | 1 | 4.07e+04 | 4.07e+04 | 9.68e+06‡ | 1.564 |" in text  # N* inside, D* above
    assert "| baseline | 1.141e+11 | 4 | 1e+03‡ | 495 | 1.80e+06 | 2.307 |" in text  # N* below, D* inside
    assert ("‡ outside the sizes or token budgets the grid trained (baseline: N 9.87e+03 .. 2.78e+05 unique "
            "parameters, D 2.50e+05 .. 2.00e+06 tokens): the law extrapolated there, not a measured optimum.") in text


def test_per_r_rows_name_d_term_parameters_apart_where_one_or_two_D_leave_them_unidentified():
    """The per-r table's "on a bound" column listed E, B and beta as for any fit, though with one or two D they are
    not identified (the joint line already named them apart); they are now marked as the D-term's, with a footnote,
    and listed plainly where three or more D identify them."""
    import pandas as pd

    from loopscale.fit.run_report import _identification_section

    ident = {"headline": "phi = 0.5", "phi": 0.5, "fixed_D": False,
             "per_r": [{"r": 2, "phi": 0.4, "lo": 0.1, "hi": 0.7, "n": 20, "on_bound": "B,E,alpha"}]}
    many = "\n".join(_identification_section({"identification": ident}, pd.DataFrame()))
    assert "| 2 | 0.4 | [0.1, 0.7] | 1.32 | B, E, alpha |" in many and "§" not in many
    for few in ({"fixed_D": True}, {"D_offsets": {"1e+06": 3.1, "2e+06": 3.0}}):
        text = "\n".join(_identification_section({"identification": {**ident, **few}}, pd.DataFrame()))
        assert "| 2 | 0.4 | [0.1, 0.7] | 1.32 | alpha (D-term: B, E §) |" in text, text
        assert "§ A parameter of the D-term E + B·D^−β, which one or two D do not identify" in text
    seeds4 = (EXAMPLE.parent / "example_cpu_seeds4" / "report.md").read_text(encoding="utf-8")
    assert "| 4 | -0.129 | [-0.736, -0.0169] | 0.836 | – (D-term: B, E §) |" in seeds4


def test_a_variant_that_trained_the_baselines_models_is_said(tmp_path):
    """A smoke-sized grid with trunc_bptt (AdamW, 8-16 steps) ended at the baseline's losses to 6 digits at r = 4
    and 8: truncation changed nothing there, and the report showed Δφ = −5e-07 [−0.001, 0.002] without a word, a
    "no change" a reader could take for a finding. The analysis names those r and the Δφ table says so."""
    import pandas as pd

    from loopscale.fit.analysis import analyze
    from loopscale.fit.run_report import build_report
    from loopscale.fit.variants import same_losses_as_baseline

    base = pd.read_parquet(EXAMPLE / "runs.parquet")
    base = base[base["status"] == "ok"]
    looped = base[base["r"] > 1].copy()
    twin = looped.assign(variant="trunc_bptt", run_id=looped["run_id"] + "t")
    twin.loc[twin["r"] == 2, "final_val_loss"] *= 1.002  # r = 2: a measurable change; r = 4, 8: the same losses
    twin.loc[twin["r"] == 4, "final_val_loss"] *= 1 + 3e-6  # within float rounding of one model
    runs = pd.concat([base, twin], ignore_index=True)
    assert same_losses_as_baseline(runs.assign(loss=runs["final_val_loss"]), "baseline", "trunc_bptt") == [4, 8]
    assert same_losses_as_baseline(runs.assign(loss=runs["final_val_loss"]), "baseline", "trunc_bptt", rtol=1e-6) == [8]
    partial = runs.drop(index=runs.index[(runs["variant"] == "baseline") & (runs["r"] == 8)][:1])
    assert same_losses_as_baseline(partial.assign(loss=partial["final_val_loss"]), "baseline", "trunc_bptt") == [4]
    run = tmp_path / "run"
    run.mkdir()
    runs.to_parquet(run / "runs.parquet")
    ana = analyze(run / "runs.parquet", run / "fit", B=0, starts=4, workers=1, plots=False)
    assert ana["variant_comparison"]["comparisons"]["trunc_bptt"]["same_losses_as_baseline_r"] == [4, 8]
    text = build_report(run).read_text(encoding="utf-8")
    sec = _section(text, "## Variants: Δφ against the baseline")
    assert "; the baseline's losses at r = 4, 8 (‖) |" in sec
    # the variant's heading counts its own runs and the shared r = 1 runs apart (it said 16 runs for 12 of its own)
    n1, n_looped = int((base["r"] == 1).sum()), len(looped)
    assert f"## Variant `trunc_bptt` ({n_looped} runs, fitted with the {n1} shared r = 1 runs)" in text
    assert f"## Variant `baseline` ({len(base)} runs)" in text
    assert "‖ **trunc_bptt trained the baseline's models at r = 4, 8**: each of its runs there ends at the loss" in sec
    assert "Truncated BPTT on short runs" in sec
    # said beside the variant's own φ too (its φ line, the console's and the report's, gave no hint), and the
    # comparison is no result in analysis.json either (it said "identified": true where φ was, and nothing else)
    c = ana["variant_comparison"]["comparisons"]["trunc_bptt"]
    assert c["a_result"] is False
    def whole(heading):  # a variant's section with its subsections
        rest = text[text.index(heading) :]
        return rest[: rest.index("\n## ", len(heading))]

    own = whole("## Variant `trunc_bptt`")
    assert ("Its runs at r = 4, 8 ended at the baseline's losses (the Δφ table's ‖): there this variant trained the "
            "baseline's models, and its φ is theirs.") in own  # fmt: skip
    from loopscale.sweep.status import fit_headlines

    (line,) = [x for x in fit_headlines(ana) if x.startswith("trunc_bptt:")]
    assert line.endswith("(its runs at r = 4, 8 ended at the baseline's losses: there it trained the baseline's "
                         "models, and this phi is theirs)")  # fmt: skip
    # each variant's φ line cites the paper's φ of that variant (every variant cited the baseline's 0.46)
    assert "failed; paper: 0.38 with bptt_k = ⌈r/2⌉ at GPU scale (Table 3, whose baseline is 0.45))" in own
    assert "failed; paper: 0.46 [0.41, 0.53] at GPU scale)" in whole("## Variant `baseline`")
    assert "paper: 0.46" not in own
    # a variant whose runs all differ gets no such note
    runs.loc[runs["variant"] == "trunc_bptt", "final_val_loss"] *= 1.01
    assert same_losses_as_baseline(runs.assign(loss=runs["final_val_loss"]), "baseline", "trunc_bptt") == []


def test_one_degenerate_draw_is_one_draw(tmp_path):
    """The joint line read "1 degenerate draws redrawn"."""
    from loopscale.fit.run_report import build_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    p = run / "fit" / "analysis.json"
    ana = json.loads(p.read_text(encoding="utf-8"))
    ana["variants"]["baseline"]["joint"]["bootstrap"]["n_degenerate"] = 1
    p.write_text(json.dumps(ana), encoding="utf-8")
    text = build_report(run).read_text(encoding="utf-8")
    assert ", 1 degenerate draw redrawn, " in text and "1 degenerate draws" not in text


def test_a_delta_phi_of_the_baselines_models_is_no_result_even_when_both_phi_are_identified(tmp_path):
    """The 'a result?' column read "yes; the baseline's losses at r = 4, 8", against its own note ("Δφ cannot show
    one"): such a row is now "no"."""
    sec = _with_variant_comparison(tmp_path, {"baseline": True, "trunc_bptt": True}, same_losses_as_baseline_r=[4, 8])
    row = next(ln for ln in sec.splitlines() if ln.startswith("| trunc_bptt"))
    assert row.endswith("| no: the baseline's losses at r = 4, 8 (‖) |") and "yes" not in row


def test_losses_of_a_small_corpus_are_said_above_the_report_and_under_the_headline(tmp_path):
    """A smoke grid on 60 short Parquet titles (about 1 KB of text) ended "phi = 0.911, 95 % CI [0.799, 1.015]",
    while every run had been evaluated on 96 of its 2,048 eval_tokens and had repeated its training tokens 3.9
    times; the report said only "(the data repeated)". The runs' own warnings now give a "Small data" note above
    the report, a `caution` line under run's headline and a `small data:` caveat in status."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopscale.fit.run_report import build_report, data_caveat
    from loopscale.sweep.status import collect_status, runs_caveats

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    assert runs_caveats(run)[0] is None and "Small data" not in build_report(run).read_text(encoding="utf-8")
    t = pq.read_table(run / "runs.parquet").to_pandas()
    assert data_caveat(t) is None
    shrunk = ("eval_tokens=2048 is more than the validation split holds (102 tokens): 96 tokens (3 windows of "
              "seq_len=32) are evaluated (give a larger corpus for a steadier loss)")  # fmt: skip
    t["warnings"] = [json.dumps([shrunk] if i % 2 else []) for i in range(len(t))]
    t.loc[t.index[:3], "epochs"] = [3.88, 1.5, 0.9]
    t.loc[t.index[0], "status"] = "diverged"  # a run not ok is not counted
    n_ok = int((t["status"] == "ok").sum())
    n_short = sum(1 for i in range(1, len(t)) if i % 2)
    said = data_caveat(t)
    assert said.startswith(f"{n_short} of {n_ok} ok runs had their validation loss measured on fewer tokens than "
                           "eval_tokens asks (as few as 96 of 2,048")  # fmt: skip
    assert f"1 of {n_ok} ok runs repeated their training tokens (up to 1.50 epochs)" in said
    pq.write_table(pa.Table.from_pandas(t, preserve_index=False), run / "runs.parquet")
    assert runs_caveats(run)[0] == said
    text = build_report(run).read_text(encoding="utf-8")
    assert f"> **Small data.** {said[0].upper()}{said[1:]}." in text
    st = collect_status(run)
    assert f"small data: {said}" in st["fit_caveats"]


def test_what_the_lr_studies_said_is_in_the_report_and_status(tmp_path):
    """`tune-lr` said "best LR at the edge of the LRs tried" for 5 of 8 studies (and named rejected trials) on the
    console only: the report's Learning rates section and `status` listed the LRs as if well tuned. The LR table
    now records each study's notes, and both say them (each once: one study's rows share them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopscale.fit.run_report import build_report, lr_study_notes
    from loopscale.sweep.status import collect_status, format_status

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    lr = pq.read_table(run / "lr_table.parquet").to_pandas()
    assert "notes" not in lr.columns and lr_study_notes(lr) == []  # a table written before the column: nothing
    edge = "best LR at the edge of the LRs tried (the best may lie beyond them): size 16, r 1: 0.0631, the highest of 8"
    rejected = "size 32, r 1: 1 of 8 trials rejected: LR 0.1: diverged"
    lr["notes"] = [json.dumps([edge] if row["size"] == 16 else [rejected] if row["size"] == 32 else [])
                   for _, row in lr.iterrows()]  # fmt: skip
    pq.write_table(pa.Table.from_pandas(lr, preserve_index=False), run / "lr_table.parquet")
    said = lr_study_notes(lr)
    assert said == [n for n in (edge, rejected) if n in said] and edge in said  # each once, in the table's order
    text = _section(build_report(run).read_text(encoding="utf-8"), "## Learning rates")
    assert "**What the LR studies said**" in text and f"- {edge}" in text and text.count(edge) == 1
    st = collect_status(run)
    assert st["lr"]["notes"] == said
    assert f"  tune-lr said: {edge}" in format_status(st)


def test_a_report_edited_since_loopscale_wrote_it_is_kept_aside_on_a_rebuild(tmp_path, monkeypatch):
    """A reader's notes added to report.md were lost on the next `loopscale report` (or `run --resume`): a rebuild
    now moves an edited report aside, with a warning, and replaces one left as written without a word. Its footer
    (a hash of the text above it) tells the two apart."""
    import time
    import warnings

    from loopscale.fit import run_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    report = run / "report.md"
    written = report.read_text(encoding="utf-8")
    assert written.endswith(" -->\n") and "<!-- loopscale report; sha256 of the text above: " in written
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as written: replaced, no warning, nothing aside
        run_report.build_report(run)
    assert report.read_text(encoding="utf-8") == written
    assert sorted(p.name for p in run.glob("report*")) == ["report.md"]
    # a note added above the footer: kept, whole
    edited = written.replace("\n## ", "\nMy note: the r = 8 runs used the old corpus.\n\n## ", 1)
    report.write_text(edited, encoding="utf-8")
    monkeypatch.setattr(time, "gmtime", lambda *a: time.struct_time((2026, 12, 6, 12, 0, 0, 6, 340, 0)))
    with pytest.warns(UserWarning, match=r"report.md was changed after loopscale wrote it: kept as "
                                         r"report_edited_20261206T120000.md, and report.md is written anew"):
        run_report.build_report(run)
    assert (run / "report_edited_20261206T120000.md").read_text(encoding="utf-8") == edited
    assert report.read_text(encoding="utf-8") == written
    # notes added after the footer (a second edit in the same second does not overwrite the first one's copy)
    report.write_text(written + "a line after the footer\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"report.md has text after its loopscale footer \(notes added at the end\): "
                                         "kept as report_edited_20261206T120000_2.md"):
        run_report.build_report(run)
    assert (run / "report_edited_20261206T120000.md").read_text(encoding="utf-8") == edited
    assert (run / "report_edited_20261206T120000_2.md").read_text(encoding="utf-8").endswith("after the footer\n")
    # no footer: as an earlier version wrote it (the same text) is replaced; any other text is kept
    body = written[: written.rindex("<!-- loopscale report; ")]
    report.write_text(body, encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_report.build_report(run)
    report.write_text("# my own notes\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"report.md has no loopscale footer \(written before loopscale hashed its "
                                         r"reports, or by someone else\) and differs from the report rebuilt now: "
                                         "kept as report_previous_20261206T120000.md"):
        run_report.build_report(run)
    assert (run / "report_previous_20261206T120000.md").read_text(encoding="utf-8") == "# my own notes\n"
    assert report.read_text(encoding="utf-8") == written
    # as written but saved with CRLF line ends, without its last newline, or with blank lines after: replaced
    for same in (written.replace("\n", "\r\n"), written[:-1], written + "\n\n"):
        report.write_bytes(same.encode("utf-8"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run_report.build_report(run)
        assert report.read_text(encoding="utf-8") == written
    # an editor's Latin-1 line, or the file re-saved as UTF-16: kept byte for byte (they were overwritten silently)
    latin1 = written.encode("utf-8").replace(b"\n## ", b"\ncaf\xe9 note\n\n## ", 1)
    utf16 = written.encode("utf-16")
    for saved, kind, n in ((latin1, "report_edited", 3), (utf16, "report_previous", 2)):
        report.write_bytes(saved)
        with pytest.warns(UserWarning, match=f"kept as {kind}_20261206T120000_{n}.md"):
            run_report.build_report(run)
        assert (run / f"{kind}_20261206T120000_{n}.md").read_bytes() == saved
        assert report.read_text(encoding="utf-8") == written


def test_a_failure_converting_a_whole_runs_table_does_not_move_it_aside(tmp_path, monkeypatch):
    """A Ctrl-C while pyarrow imported zoneinfo to convert the runs table's zoned timestamps came back from pyarrow
    as ArrowInvalid ("The zoneinfo module or pytz package must be installed"), which `report` took for a torn file:
    a whole runs.parquet was moved aside and the command said to train again. Only a failed read of the file now
    counts as torn; a failure converting what was read is raised as it is."""
    import pyarrow as pa
    import pyarrow.parquet as pq_mod

    from loopscale.fit import run_report

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    read = pq_mod.read_table

    class Read:
        def __init__(self, table):
            self.table = table

        def to_pandas(self):
            raise pa.ArrowInvalid("The zoneinfo module or pytz package must be installed.")

    monkeypatch.setattr(pq_mod, "read_table", lambda *a, **k: Read(read(*a, **k)))
    with pytest.raises(pa.ArrowInvalid, match="zoneinfo"):
        run_report._read_parquet(run / "runs.parquet")
    assert (run / "runs.parquet").is_file() and not list(run.glob("runs.parquet.unreadable-*"))


def test_report_command_prints_the_absolute_path_for_a_relative_folder(tmp_path, monkeypatch):
    """`loopscale report DIR` with a relative DIR printed the relative path of the report (`run/report.md`),
    where `run` prints an absolute one; it now prints the absolute path, and the report's text is the same."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["report", "run"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == str(run.resolve() / "report.md")
    first = (run / "report.md").read_text(encoding="utf-8")
    assert CliRunner().invoke(app, ["report", str(run)]).exit_code == 0
    assert (run / "report.md").read_text(encoding="utf-8") == first


def test_report_of_a_folder_run_would_refuse_says_why_instead_of_advising_it(tmp_path):
    """A folder without a fit whose runs all finished with none ok: `report` advised `loopscale run ... --resume`,
    which `run` refuses there (nothing its fit stage can fit). It now says why `run` cannot make the fit."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app
    from loopscale.sweep.presets import preset_spec
    from loopscale.sweep.spec import spec_to_yaml
    from loopscale.sweep.store import ResultsStore, run_record

    spec = preset_spec("smoke")
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.yaml").write_text(spec_to_yaml(spec))
    store = ResultsStore(run)
    for c in spec.cells():
        store.write_run(run_record(c, {"status": "diverged"}))
    store.consolidate()
    res = CliRunner().invoke(app, ["report", str(run)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and (f"{run / 'fit' / 'analysis.json'} not found, and `loopscale run` cannot make it: "
                                   f"every run of the grid in {run} finished and none is ok (16 diverged)") in text, text
    assert "--resume" not in text
