"""A run whose cell column (d_model, layers_unique) is null belongs to no cell of a seed-replicate fit: refused,
naming the column and the runs, before anything is fitted (the cell means dropped such runs silently, and the
bootstrap, which kept them, crashed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_cpu"


def _no_fit(*_a, **_k):
    raise AssertionError("a fit ran before the table was refused")


@pytest.mark.parametrize("boot", [[], ["--bootstrap", "5", "--workers", "1"]])
def test_a_null_d_model_on_some_runs_is_refused_before_any_fit(tmp_path, monkeypatch, boot):
    from typer.testing import CliRunner

    import loopscale.fit.fitter as fitter
    from loopscale.sweep.cli import app

    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    df["d_model"] = df["d_model"].astype(float)
    df.loc[df["r"] == 2, "d_model"] = np.nan
    first = df.loc[df["r"] == 2, "run_id"].iloc[0]
    path = tmp_path / "runs.parquet"
    df.to_parquet(path)
    monkeypatch.setattr(fitter, "fit_data", _no_fit)
    res = CliRunner().invoke(app, ["fit", str(path), "--starts", "20", *boot])
    assert res.exit_code == 2, res.output
    msg = " ".join(res.output.split())
    assert "column 'd_model' is null on 64 of 352 runs" in msg and f"run_id '{first}'" in msg, msg


def test_a_null_layer_count_is_refused_too_and_a_column_null_on_every_run_is_left_out():
    from loopscale.fit import fit_table
    from loopscale.fit.io import cell_means

    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    df["n_coda"] = df["n_coda"].astype(float)
    df.loc[df.index[:3], "n_coda"] = np.nan  # layers_unique = n_prelude + n_recur_block + n_coda: null there
    with pytest.raises(ValueError, match=r"column 'layers_unique' is null on 3 of 352 runs"):
        fit_table(df, starts=10)
    with pytest.raises(ValueError, match=r"cell_means: column 'd_model' is null on 1 of 4 runs \(row 2\)"):
        cell_means(pd.DataFrame({"d_model": [1.0, 1.0, None, 2.0], "loss": [3.0, 3.1, 3.2, 3.3]}), ("d_model",))
    # d_model null on every run tells no cells apart: the cells are those of the other columns, all runs fitted
    tf = fit_table(pd.read_parquet(EXAMPLE / "runs.parquet").assign(d_model=None), starts=20)
    assert tf.replicates.strata == ("r", "layers_unique", "D") and tf.replicates.cells == 8 and tf.fit.n == 8
