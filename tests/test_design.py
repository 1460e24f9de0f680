"""Design prediction: simulated refits of phi, seed noise and wall time (fit/design.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale.fit.design import flop_rate, seed_noise, simulate_phi, wall_time_s

TRUTH = dict(E=1.5, A=20.0, alpha=0.3, B=50.0, beta=0.35, phi=0.46)


def _design(seeds: int, widths=(16, 32, 48, 64), tokens=(5e5, 1e6, 4e6)) -> pd.DataFrame:
    rows = []
    for d in widths:
        nb = 12 * d * d + 2 * d
        for D in tokens:
            for r in (1, 2, 4, 8):
                n_once, n_rec = (10 * nb + 3 * d, 0.0) if r == 1 else (2 * nb + 3 * d, (8 // r) * nb + 2 * d * d)
                for s in range(seeds):
                    rows.append(dict(d_model=d, r=r, N_once=n_once, N_rec=n_rec, D=D, seed=s,
                                     C=6 * (n_once + r * n_rec) * D))
    return pd.DataFrame(rows)


def test_simulated_precision_scales_with_noise_and_seeds():
    lo = simulate_phi(_design(1), TRUTH, 0.005, n_sim=12, starts=12, seed=0)
    hi = simulate_phi(_design(1), TRUTH, 0.02, n_sim=12, starts=12, seed=0)
    more = simulate_phi(_design(4), TRUTH, 0.02, n_sim=12, starts=12, seed=0)
    assert lo.n_ok == 12 and lo.n_runs == 48 and more.n_runs == 192
    assert lo.phi_half_width < hi.phi_half_width  # 4x the noise -> a wider interval
    assert more.phi_half_width < hi.phi_half_width  # 4 seeds per cell -> narrower
    assert abs(lo.phi_bias) < 0.1 and lo.phi_half_width < 0.3
    assert set(lo.r_phi_half_width) == {2, 4, 8}


def test_seed_noise_recovers_a_known_spread():
    rng = np.random.default_rng(0)
    d = _design(6)
    d["loss"] = 2.0 * np.exp(0.015 * rng.standard_normal(len(d)))
    sigma, cells = seed_noise(d)
    assert cells == 48 and sigma == pytest.approx(0.015, rel=0.12)
    assert np.isnan(seed_noise(_design(1).assign(loss=2.0))[0])


def test_wall_time_packs_runs_onto_slots():
    d = pd.DataFrame({"C": [100.0, 100.0, 100.0, 100.0]})
    assert wall_time_s(d, rate=10.0, slots=2, overhead_s=0) == pytest.approx(20.0)
    assert wall_time_s(d, rate=10.0, slots=1, overhead_s=1) == pytest.approx(44.0)
    runs = pd.DataFrame({"C": [1e12, 2e12], "wall_s": [10.0, 20.0], "status": ["ok", "ok"]})
    assert flop_rate(runs) == pytest.approx(1e11)
    with pytest.raises(ValueError, match="slots"):
        wall_time_s(d, rate=10.0, slots=0)
