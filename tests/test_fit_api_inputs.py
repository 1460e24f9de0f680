"""The Python API takes what its docs promise and refuses the rest with a message that names it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_cpu"


def test_ladder_table_takes_a_runs_parquet_path_and_its_columns():
    """ladder_table('.../runs.parquet') raised AttributeError ('str' has no 'columns'), and runs.parquet's own
    columns (final_val_loss, n_prelude/n_recur_block/n_coda) were not read as loss and layers_unique."""
    from loopscale.fit import ladder_table

    from_path = ladder_table(EXAMPLE / "runs.parquet", n_boot=20, seed=0)
    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    by_hand = df.assign(loss=df["final_val_loss"], layers_unique=df["n_prelude"] + df["n_recur_block"] + df["n_coda"])
    ref = ladder_table(by_hand, n_boot=20, seed=0)
    assert list(from_path["r"]) == [2, 4, 8]
    pd.testing.assert_frame_equal(from_path, ref)
    with pytest.raises(ValueError, match=r"missing layers_unique \(or n_prelude, n_recur_block and n_coda\)"):
        ladder_table(df.drop(columns=["n_coda"]))
    with pytest.raises(ValueError, match=r"missing loss \(or final_val_loss\)"):
        ladder_table(df.drop(columns=["final_val_loss"]))
    nul = df.assign(d_model=df["d_model"].astype(float))
    nul.loc[nul["r"] == 4, "d_model"] = None
    with pytest.raises(ValueError, match=r"ladder_table: column 'd_model' is null on 64 of 352 runs"):
        ladder_table(nul, n_boot=5)


@pytest.mark.filterwarnings("ignore::UserWarning")  # PerRunFitWarning: fit_law and bootstrap fit every run
def test_bootstrap_refuses_the_per_r_law_and_a_point_of_another_law():
    import loopscale.fit.bootstrapping as bs
    from loopscale.fit import bootstrap, fit_law

    with pytest.raises(ValueError, match=r"law 'joint_per_r' is a point fit .*has no bootstrap") as e:
        bootstrap(EXAMPLE / "runs.parquet", law="joint_per_r", B=2, workers=1)
    assert "rs" not in str(e.value).split()
    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    chin = fit_law(df[df["r"] == 1].assign(N=lambda d: d["N_unique"]), law="chinchilla", starts=5)
    fixed = fit_law(df, law="joint", phi=0.0, starts=5)
    for point, phi, said in ((chin, None, r"law 'chinchilla' with 5 fitted parameters, and the bootstrap refits law "
                                           r"'joint' with 6 fitted parameters"),
                             (fixed, None, r"law 'joint' with 5 fitted parameters \(phi fixed at 0\), and the "
                                           r"bootstrap refits law 'joint' with 6"),
                             (fixed, 1.0, r"\(phi fixed at 0\), and the bootstrap refits law 'joint' with 5 fitted "
                                          r"parameters \(phi fixed at 1\)")):  # fmt: skip
        with pytest.raises(ValueError, match=said):
            bootstrap(df, law="joint", phi=phi, B=2, workers=1, starts=5, point=point)
    bs.check_point(fixed, bs.make_law("joint", 0.0))  # the same law: accepted


def test_fit_table_says_a_bootstrap_of_zero_is_valid():
    from loopscale.fit import fit_table

    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"must be a whole number >= 0 of resamples \(0: no bootstrap"):
            fit_table(EXAMPLE / "runs.parquet", bootstrap=bad)
