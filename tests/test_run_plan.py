"""`loopscale run --dry-run` plans and the shape of the shipped grids (what the presets must cover)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loopscale.model.accounting import flops_per_token
from loopscale.sweep.presets import preset_spec
from loopscale.sweep.run import plan
from loopscale.sweep.spec import SpecError


def _compute_span(spec) -> float:
    lr = {(s, None): 1.0 for s in spec.all_sizes()}
    cs = []
    for c in spec.cells(lr_table=lr):
        run = c.run
        cs.append(run.target_flops if run.target_flops else flops_per_token(run.model) * run.tokens)
    return max(cs) / min(cs)


def test_paper_preset_spans_r_sizes_and_10x_compute():
    """paper grid: r in {1,2,4,8}, >= 3 sizes, >= 3 budgets, >= 10x compute between runs."""
    spec = preset_spec("paper")
    assert sorted(spec.r) == [1, 2, 4, 8]
    assert len(spec.all_sizes()) >= 3
    assert len(spec.budgets) >= 3
    assert _compute_span(spec) >= 10


def test_cpu_preset_is_the_ladder_design_with_seeds():
    """cpu: r in {1,2,4,8} plus a plain-depth ladder at one width and one D, 16 seeds per plain cell and 32 per
    looped cell, MuonH, >= 50 tokens per unique parameter for the looped models (the measured threshold), packed
    into seed ensembles of 16, and accepted by run."""
    from loopscale.model.accounting import n_unique
    from loopscale.sweep.grid import trial_groups
    from loopscale.sweep.run import check_design

    spec = preset_spec("cpu")
    cells = spec.cells()
    assert sorted(spec.r) == [1, 2, 4, 8] and spec.ladder == [2, 3, 4, 6]
    assert [len(spec.seeds_for(r)) for r in (1, 2, 4, 8)] == [32, 64, 64, 64]
    assert len(cells) == (1 + 4) * 32 + 3 * 64
    assert sorted(len(g) for g in trial_groups(cells, spec.ensemble_members())) == [16] * 22
    assert all(c.run.compile for c in cells)
    depths = {c.run.model.n_prelude + c.run.model.n_recur_block + c.run.model.n_coda for c in cells if c.r == 1}
    assert depths == {2, 3, 4, 6, 10}
    assert {c.run.optimizer for c in cells} == {"muonh"}
    assert min(c.run.tokens / n_unique(c.run.model) for c in cells if c.r > 1) >= 50
    check_design(spec)


def test_plan_counts_the_trials_seed_ensembles_pack():
    """The cpu preset: 352 runs as 22 seed-ensemble trials of 16; with resources.ensemble 12 each cell's seeds
    split into chunks of at most 12 (32 -> 11 + 11 + 10 for the 5 plain cells, 64 -> 5 x 11 + 9 for the 3 looped)."""
    spec = preset_spec("cpu")
    p = plan(spec)
    assert (p["runs"], p["trials"], p["runs_per_trial"]) == (352, 22, {"16": 22})
    p = plan(spec.model_copy(update={"resources": spec.resources.model_copy(update={"ensemble": 12})}))
    assert p["trials"] == 5 * 3 + 3 * 6 and sum(int(k) * n for k, n in p["runs_per_trial"].items()) == 352
    assert p["runs_per_trial"] == {"11": 5 * 2 + 3 * 5, "10": 5, "9": 3}


def test_paper_plan_matches_the_papers_grid():
    """116 runs, 29 per r, and the summed training FLOPs of the paper's budgets (sum over cells of C)."""
    p = plan(preset_spec("paper"))
    assert p["runs"] == 116 and p["runs_by_r"] == {"1": 29, "2": 29, "4": 29, "8": 29}
    assert p["trials"] == 116 and p["runs_per_trial"] == {"1": 116}  # one seed on GPUs: every run its own trial
    # D = round(C / (F B)) B makes each run's FLOPs within half a step of C
    expected = sum(c * len(s) * 4 for c, s in preset_spec("paper").budgets.items())
    assert p["train_flops_total"] == pytest.approx(expected, rel=2e-3)
    assert p["est_gpu_hours_grid"] == pytest.approx(expected / (989e12 * 0.4) / 3600, rel=2e-3)


def test_dry_run_cli_prints_plan_json_without_starting_anything(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopscale.sweep.cli",
            "run",
            "--preset",
            "paper",
            "--dry-run",
            "--json",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    p = json.loads(out.stdout)
    assert p["runs"] == 116 and p["lr_trials"] == 116 // 29 * 11 * 8
    assert not (tmp_path / "x").exists()
    # the paper's trials ask for 8 CPUs and a GPU each: the plan holds (exit 0), and it says when this machine
    # would refuse them
    import os

    import torch

    if torch.cuda.is_available() and (os.cpu_count() or 1) >= 8:
        assert p["refused_here"] is None
    else:
        assert p["refused"] is None and p["refused_here"].endswith("(with these options on this machine; the plan "
                                                                  "holds for a cluster)")
        assert "no GPU is available here" in p["refused_here"] or "the embedded Ray has" in p["refused_here"]


def test_run_rejects_spec_and_preset_together(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopscale.sweep.cli",
            "run",
            "configs/smoke.yaml",
            "--preset",
            "smoke",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "not both" in out.stderr
    assert not (tmp_path / "x").exists()


def test_run_refuses_a_grid_the_joint_law_cannot_fit_before_training(tmp_path):
    """2 runs cannot identify 6 parameters: `run` says so before any training and writes no results."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        "name: tiny\nmodel: {preset: cpu, seq_len: 32}\nr: [1, 2]\nsizes: [16]\ntokens: [2048]\n"
        "training: {batch_tokens: 256, eval_tokens: 2048}\nlr: {fixed: 0.01}\n"
    )
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "loopscale.sweep.cli", "run", str(spec), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "nothing was trained" in p.stderr, p.stderr
    assert not (out / "runs.parquet").exists() and not (out / "parts").exists()


def test_plan_gives_each_lr_study_its_tokens_after_rounding():
    """tune.tokens is trained in whole steps, a whole number per milestone: at 256 tokens per step and 4 milestones,
    3000 tokens is 12 steps (3072 tokens) and 500 tokens is 4 steps (1024, one per milestone). One study per size at
    the largest r without tune_per_r."""
    import copy

    from loopscale.sweep.presets import PRESETS
    from loopscale.sweep.spec import parse_spec

    d = copy.deepcopy(PRESETS["smoke"])
    d["lr"] = "tune"
    d["tune"] = {**d.get("tune", {}), "tokens": 3000, "num_milestones": 4}
    spec = parse_spec(d)
    assert spec.training.batch_tokens == 256 and len(spec.r) > 1
    p = plan(spec)
    assert p["lr_trial_tokens"] == {f"size{s}_r{r}": 3072 for s in spec.all_sizes() for r in spec.r}
    d["tune"].update(tokens=500, tune_per_r=False)
    p = plan(parse_spec(d))
    assert p["lr_trial_tokens"] == {f"size{s}_r{max(spec.r)}": 1024 for s in spec.all_sizes()}
    assert p["lr_studies"] == len(spec.all_sizes())


def test_the_plan_lists_the_token_budgets_the_trainer_rounds():
    """A token budget that is not a whole number of batches was rounded without a word, in the dry run too: the
    plan now lists each written value and the D it trains (None when all are whole batches)."""
    import copy

    from loopscale.sweep.presets import PRESETS
    from loopscale.sweep.spec import parse_spec

    d = copy.deepcopy(PRESETS["smoke"])
    assert plan(parse_spec(d))["tokens_rounding"] is None
    d["tokens"] = [300, 2048, 700]
    p = plan(parse_spec(d))
    assert p["tokens_rounding"] == ("tokens are trained in whole batches of training.batch_tokens = 256: "
                                    "300 -> D = 256, 700 -> D = 768")  # fmt: skip


def test_the_plan_warns_of_runs_of_a_few_steps_and_budgets_whole_steps_miss():
    """Iso-FLOP budgets of 7.1e8 at 1,024 tokens a step planned without a word, though most runs got 1-2 steps and
    trained 0.67-1.99x their budget. The numbers are worked out here from the accounting."""
    from loopscale.model.accounting import flops_per_token
    from loopscale.sweep.spec import parse_spec

    assert plan(preset_spec("smoke"))["steps_warning"] is None  # 8 steps a run
    assert plan(preset_spec("cpu"))["steps_warning"] is None
    spec = parse_spec({"name": "tiny_budgets", "r": [1, 2, 4, 8], "budgets": {7.1e8: [16, 32], 3e9: [16, 32]},
                       "training": {"batch_tokens": 1024}, "lr": {"fixed": 0.01}})  # fmt: skip
    few, drift = 0, {}
    for c in spec.cells():
        f = flops_per_token(c.run.model)
        steps = max(1, round(c.run.target_flops / (f * 1024)))
        few += steps < 5
        if abs(f * steps * 1024 / c.run.target_flops - 1) > 0.1:
            drift[(c.size, c.r, c.run.target_flops)] = f * steps * 1024 / c.run.target_flops
    assert few == 12 and len(drift) == 10
    worst = max(drift.items(), key=lambda kv: abs(kv[1] - 1))
    w = plan(spec)["steps_warning"]
    assert w.startswith("12 run(s) train fewer than 5 optimizer steps of training.batch_tokens = 1024 (")
    assert "; 10 iso-FLOP run(s) train whole steps whose FLOPs F·D miss the budget C by more than 10 % (" in w
    assert f"size {worst[0][0]} r={worst[0][1]} at C = 7.1e+08: {worst[1]:.2f}× C" in w
    assert w.endswith("; raise the compute budgets (budgets: {C: [sizes]}) or lower training.batch_tokens")  # not tokens:
    few_tokens = parse_spec({"name": "few", "r": [1, 2], "sizes": [16], "tokens": [2048], "lr": {"fixed": 0.01}})
    w = plan(few_tokens)["steps_warning"]  # 2 steps of 1,024 tokens: a token-budget spec is told of its tokens
    assert w.startswith("2 run(s) train fewer than 5") and w.endswith("; raise the token budgets (tokens) or lower "
                                                                       "training.batch_tokens")  # fmt: skip
    # a ladder's plain models (r = 1 at the grid's size) are told apart from the grid's r = 1 by their layers
    ladder = parse_spec({"name": "few", "r": [1, 2], "sizes": [16], "tokens": [2048], "ladder": [3],
                         "training": {"batch_tokens": 1024}, "lr": {"fixed": 0.01}})  # fmt: skip
    depth = ladder.cells()[0].run.model.effective_depth
    w = plan(ladder)["steps_warning"]
    assert w.startswith(f"3 run(s) train fewer than 5 optimizer steps of training.batch_tokens = 1024 (size 16 r=1 "
                        f"({depth} layers) at tokens 2048: 2 steps, size 16 r=2 at tokens 2048: 2 steps, size 16 r=1 "
                        "(3 layers) at tokens 2048: 2 steps)"), w  # fmt: skip


def test_a_grid_without_r1_is_planned_with_a_warning(tmp_path):
    """A grid of r = 2, 4, 8 only was accepted without a word, and its report silently lacked the per-r phi
    check (each r against the r = 1 runs); the plan (--dry-run) and `run` now say so. The presets have r = 1."""
    from loopscale.sweep.run import design_warning

    spec = preset_spec("smoke")
    assert plan(spec)["design_warning"] is None and design_warning(preset_spec("cpu")) is None
    no_r1 = spec.model_copy(update={"r": [2, 4, 8]})
    assert plan(no_r1)["design_warning"].startswith("the grid has no r = 1 runs (r = [2, 4, 8]): phi cannot be")


def test_variants_without_baseline_are_planned_with_a_warning_and_tuned_on_the_baseline_model():
    """`variants: [trunc_bptt, hyperconnect]` with `lr: tune`: the dry run and tune-lr crashed (IndexError in
    tuning_budget, after the first study had trained), as the LR studies looked for baseline cells at r > 1. The
    studies now tune the baseline model of each (size, r), whose LR every variant trains with, as when baseline is
    listed; the plan says that such a spec gets no Δφ."""
    from loopscale.sweep.lr_search import study_keys, tuning_budget
    from loopscale.sweep.run import design_warning

    spec = preset_spec("smoke").model_copy(update={"lr": "tune"})
    listed = spec.model_copy(update={"variants": ["baseline", "trunc_bptt", "hyperconnect"]})
    left_out = spec.model_copy(update={"variants": ["trunc_bptt", "hyperconnect"]})
    assert design_warning(listed) is None and design_warning(spec.model_copy(update={"variants": ["hyperconnect"]})) is None
    assert design_warning(left_out).startswith("variants ['trunc_bptt', 'hyperconnect'] leave out baseline: each")
    assert plan(left_out)["design_warning"] == design_warning(left_out)
    for size, r in study_keys(left_out):
        got, want = tuning_budget(left_out, size, r), tuning_budget(listed, size, r)
        assert got[0].variant == "baseline" and got[0].run.model == want[0].run.model and got[1:] == want[1:]
    assert plan(left_out)["lr_trial_tokens"] == plan(listed)["lr_trial_tokens"]
    both = left_out.model_copy(update={"r": [2, 4, 8]})
    assert design_warning(both) == design_warning(spec.model_copy(update={"r": [2, 4, 8]})) + "; " + design_warning(left_out)


def test_the_plan_counts_lr_tuning_flops_and_warns_when_they_exceed_the_grids():
    """`lr: tune` on a small grid can cost more than the grid (a user's smoke-sized spec: 64 LR trials of 0.3-1.4 M
    tokens, ~100x the grid's tokens; the smoke preset itself: 2x its FLOPs), while the plan's FLOPs and GPU-hours
    counted the grid alone, without a word."""
    spec = preset_spec("smoke")
    assert spec.lr != "tune" and plan(spec)["lr_flops_max"] == 0 and plan(spec)["lr_warning"] is None
    tuned = spec.model_copy(update={"lr": "tune"})
    p = plan(tuned)
    assert p["lr_flops_max"] == pytest.approx(2 * p["train_flops_total"], rel=0.01)
    assert p["lr_warning"].startswith("LR tuning may cost up to ")
    cheap = tuned.model_copy(update={"tune": tuned.tune.model_copy(update={"tokens": 256, "num_samples": 2})})
    assert plan(cheap)["lr_warning"] is None and plan(cheap)["lr_flops_max"] < p["lr_flops_max"]
    assert "lower tune.tokens" in p["lr_warning"] and p["lr_tokens_rounding"] is None
    # 50 milestones of at least one 256-token step: every trial trains 12800 tokens for the 2048 asked; the warning
    # advised lowering tune.tokens, which changes nothing here (a user's spec: 6.25x the grid)
    many = tuned.model_copy(update={"tune": tuned.tune.model_copy(update={"num_milestones": 50, "grace_milestones": 1})})
    m = plan(many)
    assert m["lr_trial_tokens"]["size16_r1"] == 50 * 256
    assert m["lr_warning"].endswith("lower tune.num_milestones (or training.batch_tokens), tune.num_samples, or fix lr")
    assert m["lr_tokens_rounding"].startswith("an LR trial trains at least one step of training.batch_tokens = 256 per "
                                              "milestone (tune.num_milestones = 50), so size16_r1 trains 12800 tokens "
                                              f"for the {many.tune.tokens:.4g} asked")  # fmt: skip


_CPUS4 = (
    "name: x\nmodel: {preset: cpu, seq_len: 32}\nr: [1, 2, 4, 8]\ntraining: {batch_tokens: 256, eval_tokens: 2048}\n"
    "sizes: [16]\ntokens: [2048, 4096]\n"
)


def _stages_stopped_in_ray(monkeypatch):
    """Ray replaced by a recorder of each ``ray_session`` call's options; the tune-lr and sweep stages stopped (Stop)
    at their first step inside it, after their own checks ran."""
    import contextlib

    import loopscale.cluster.connect as connect
    import loopscale.sweep.commands as commands
    import loopscale.sweep.lr_search as lr_search

    class Stop(Exception):
        pass

    calls = []

    @contextlib.contextmanager
    def recorded(address=None, *, num_cpus=None, num_gpus=None, temp_dir=None, **kw):
        calls.append((address, num_cpus, num_gpus, temp_dir))
        yield connect.RayInfo(address=address or "127.0.0.1:6379", started_by_us=address is None,
                              cpus=float(num_cpus or 2), gpus=float(num_gpus or 0), nodes=1)  # fmt: skip

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(connect, "ray_session", recorded)
    monkeypatch.setattr(connect, "check_reachable", lambda *a, **k: None)
    monkeypatch.setattr(connect, "no_node_fits", lambda *a, **k: None)  # it asks the (here absent) Ray for its nodes
    monkeypatch.setattr(lr_search, "_run_study", stop)
    monkeypatch.setattr(commands, "_experiments", stop)
    return Stop, calls


@pytest.mark.parametrize("lr", ["tune", "{fixed: 0.01}"])
def test_run_gives_its_ray_options_to_the_tune_lr_and_sweep_stages(tmp_path, monkeypatch, lr):
    """`run --num-cpus 8` of a spec whose trials ask for 4 CPUs, on a 2-core machine: the tune-lr and sweep stages
    check resources.cpus against the 8 CPUs and start their Ray with the options, as `loopscale tune-lr` / `sweep`
    do. They were called with the address alone: their check counted this machine's cores ("error: resources.cpus=4
    per trial, but the embedded Ray has 2 CPUs (the cores of this machine)") after the folder was written."""
    import os

    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    Stop, calls = _stages_stopped_in_ray(monkeypatch)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    spec = tmp_path / "cpus4.yaml"
    spec.write_text(_CPUS4 + f"lr: {lr}\nresources: {{cpus: 4}}\n")
    temp = "/tmp/lsray_opts"
    options = (["--num-cpus", "8", "--num-gpus", "0", "--ray-temp-dir", temp], (None, 8, 0, temp))
    cluster = (["--address", "127.0.0.1:6379"], ("127.0.0.1:6379", None, None, None))  # the cluster decides
    for flags, want in (options, cluster):
        calls.clear()
        res = CliRunner().invoke(app, ["run", str(spec), "--out", str(tmp_path / f"o{len(flags)}"), *flags])
        assert isinstance(res.exception, Stop), res.output
        # run's own session, then the stage's (tune-lr's with lr: tune, else the sweep's)
        assert calls == [want, want], (flags, res.output)


def test_a_fit_only_rerun_starts_its_ray_with_the_options(tmp_path, monkeypatch):
    """When the grid is done and only the fit runs (no Ray for the stages above), `run --num-cpus N` (or
    --num-gpus / --ray-temp-dir) fits in an embedded Ray started with them, as the stages would have; without them
    the fit is left to start its own Ray (the bootstrap's, on all cores)."""
    from typer.testing import CliRunner

    import loopscale.fit.analysis as analysis
    from loopscale.sweep import run as run_mod
    from loopscale.sweep.cli import app

    Stop, calls = _stages_stopped_in_ray(monkeypatch)
    seen = []

    def analyze(*a, **k):
        seen.append(list(calls))
        raise Stop

    monkeypatch.setattr(run_mod, "_grid_done", lambda spec, out: True)
    monkeypatch.setattr(analysis, "file_digest", lambda p: "digest")
    monkeypatch.setattr(analysis, "analyze", analyze)
    spec = tmp_path / "s.yaml"
    spec.write_text(_CPUS4 + "lr: {fixed: 0.01}\n")
    for flags, want in ((["--num-cpus", "2"], [(None, 2, None, None)]), ([], [])):
        calls.clear()
        res = CliRunner().invoke(app, ["run", str(spec), "--out", str(tmp_path / "o"), *flags])
        assert isinstance(res.exception, Stop), res.output
        assert seen.pop() == want


def test_run_refuses_resources_no_embedded_ray_has_before_writing_the_folder(tmp_path, monkeypatch):
    """A trial asking for more CPUs / GPUs than the embedded Ray would have (--num-cpus / --num-gpus, else this
    machine's cores and CUDA devices) is refused by `run` before its folder is written, with the line its
    --dry-run gives as refused_here; with --address the cluster decides (not refused)."""
    import os

    import torch
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr("loopscale.cluster.connect.check_reachable", lambda *a, **k: None)
    cases = [
        ("{cpus: 4}", ["--num-cpus", "3"], "resources.cpus=4 per trial, but the embedded Ray has 3 CPUs (--num-cpus)"),
        ("{cpus: 4}", [], "resources.cpus=4 per trial, but the embedded Ray has 2 CPUs (the cores of this machine)"),
        ("{cpus: 1, gpus: 1}", ["--num-gpus", "0"], "resources.gpus=1 per trial, but the embedded Ray has 0 GPUs"),
        ("{cpus: 1, gpus: 2}", [], "resources.gpus=2 per trial, but the embedded Ray has 1 GPUs"),
        ("{cpus: 4, gpus: 2}", ["--address", "127.0.0.1:6379"], None),
    ]
    for i, (resources, flags, said) in enumerate(cases):
        spec = tmp_path / f"s{i}.yaml"
        spec.write_text(_CPUS4 + f"lr: {{fixed: 0.01}}\nresources: {resources}\n")
        out = tmp_path / f"o{i}"
        res = CliRunner().invoke(app, ["run", str(spec), "--out", str(out), "--dry-run", "--json", *flags])
        assert res.exit_code == 0, res.output
        here = json.loads(res.stdout)["refused_here"]
        if said is None:
            assert here is None, here
            continue
        assert here.startswith(said) and here.endswith(" (with these options on this machine; the plan holds for a "
                                                       "cluster)"), here  # fmt: skip
        res = CliRunner().invoke(app, ["run", str(spec), "--out", str(out), *flags])
        assert res.exit_code == 2, res.output
        assert f"error: {here.removesuffix(' (with these options on this machine; the plan holds for a cluster)')}" in (
            res.output
        )
        assert not out.exists()


def test_refused_here_names_every_resource_this_machine_lacks(tmp_path, monkeypatch):
    """`run --preset paper --dry-run` on a 2-core machine without a GPU named only the CPUs in refused_here; the
    missing GPU showed up only after --num-cpus 8. Every resource the trials ask for and the machine lacks is named
    at once, and `run` refuses with the same line."""
    import os

    import torch
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "x"
    res = CliRunner().invoke(app, ["run", "--preset", "paper", "--out", str(out), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    line = ("resources.cpus=8 per trial, but the embedded Ray has 2 CPUs (the cores of this machine); and "
            "resources.gpus=1 but no GPU is available here (torch.cuda.is_available() is False): no trial could "
            "start; set resources.cpus <= 2 and resources.gpus: 0, or pass --address of a larger GPU cluster")  # fmt: skip
    assert json.loads(res.stdout)["refused_here"] == (
        f"{line} (with these options on this machine; the plan holds for a cluster)"
    )
    with pytest.raises(SpecError) as e:
        preset_spec("paper").check_runtime(data=False)
    assert str(e.value) == line
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(SpecError) as e:
        preset_spec("paper").check_runtime(num_cpus=4, data=False)
    assert str(e.value) == (
        "resources.cpus=8 per trial, but the embedded Ray has 4 CPUs (--num-cpus); and resources.gpus=1 per trial, "
        "but the embedded Ray has 0 GPUs: no trial could start; set resources.cpus <= 4 and resources.gpus <= 0, "
        "or pass --address of a larger cluster"
    )
    assert not out.exists()


def _dry(out, *extra):
    return subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", "--preset", "smoke", "--dry-run",
                           "--json", "--out", str(out), *extra], capture_output=True, text=True, timeout=120)  # fmt: skip


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_dry_run_changes_nothing_and_names_what_run_would_refuse(tmp_path):
    """`run --dry-run` renamed an unreadable runs.parquet (moved aside as a torn file) and said `refused: None`
    for a folder holding someone else's curves.parquet, which `run` refuses. It now changes nothing, lists the
    files `run` would move aside, and refuses what `run` refuses."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "runs.parquet").write_text("my notes")
    before = _tree(torn)
    res = _dry(torn)
    assert res.returncode == 0, res.stderr
    p = json.loads(res.stdout)
    assert p["refused"] is None and len(p["unreadable"]) == 1
    assert p["unreadable"][0].startswith(f"{torn / 'runs.parquet'} is unreadable (")
    assert "the command would move it aside" in p["unreadable"][0]
    assert _tree(torn) == before  # nothing renamed, nothing written
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), theirs / "curves.parquet")
    before = _tree(theirs)
    res = _dry(theirs)
    assert res.returncode == 2
    p = json.loads(res.stdout)
    assert p["refused"].startswith(f"--out {theirs} holds curves.parquet, which `loopscale run` writes")
    assert _tree(theirs) == before


def test_a_dry_run_lists_a_torn_corpus_json_lr_table_and_run_meta_and_moves_none(tmp_path):
    """`run --dry-run` moved a torn corpus.json aside (to corpus.json.unreadable-<id>) and said `unreadable: null`,
    and with `lr: tune` left out a torn lr_table.parquet, which `run` moves aside too. It now lists each file `run`
    would move aside and changes nothing in the folder."""
    from loopscale.sweep.spec import spec_to_yaml

    out = tmp_path / "out"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(preset_spec("smoke").model_copy(update={"lr": "tune"})))
    (out / "corpus.json").write_text("{")
    (out / "lr_table.parquet").write_text("garbage")
    (out / "run_meta.json").write_text("[")
    before = _tree(out)
    res = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", str(out / "spec.yaml"), "--dry-run",
                          "--json", "--out", str(out)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    p = json.loads(res.stdout)
    assert p["refused"] is None
    assert p["unreadable"] == [
        f"{out / 'corpus.json'} is unreadable (not valid JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)): the command would move it aside and treat it as missing",
        f"{out / 'lr_table.parquet'} is unreadable (Parquet file size is 7 bytes, smaller than the minimum file "
        "footer (8 bytes)): the command would move it aside and read it as absent (tune-lr rebuilds the LR table "
        "from its finished studies)",
        f"{out / 'run_meta.json'} is unreadable (not valid JSON: Expecting value: line 1 column 2 (char 1)): the "
        "command would move it aside and treat it as missing",
    ]
    assert "moved aside" not in res.stderr, res.stderr
    assert _tree(out) == before  # nothing renamed, nothing written


def test_a_foreign_runs_parquet_is_refused_as_not_a_results_table(tmp_path):
    """A runs.parquet of someone else's (no run_id column) was read with the results schema as rows of nulls and
    refused as '1 of its 1 recorded runs are not cells of this spec (None (r None, ...))'. It is named as not a
    loopscale results table, by the dry run and by `run`, before anything starts; nothing there changes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopscale.sweep.store import ForeignTableError, ResultsStore

    out = tmp_path / "foreign"
    out.mkdir()
    pq.write_table(pa.table({"text": ["a sentence", "another one"]}), out / "runs.parquet")
    before = _tree(out)
    with pytest.raises(ForeignTableError, match=r"runs.parquet is not a loopscale results table \(no run_id or status "
                                                r"column; its columns: text\)"):  # fmt: skip
        ResultsStore(out).recorded()
    res = _dry(out)
    assert res.returncode == 2 and "is not a loopscale results table (no run_id or status column" in json.loads(res.stdout)["refused"]
    res = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", "--preset", "smoke", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "is not a loopscale results table (no run_id or status column" in res.stderr
    assert "None (r None" not in res.stdout + res.stderr
    assert _tree(out) == before


def test_a_negative_fit_seed_is_refused_before_anything_runs(tmp_path):
    """`run --seed -1` passed the dry run (refused: None) and every stage up to the fit, which then failed with
    numpy's 'expected non-negative integer' after the whole grid had trained; `fit --seed -1` failed the same way.
    Both refuse it with the option's name before anything starts."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", "--preset", "smoke", "--out", str(out), "--seed", "-1", "--dry-run"])
    assert res.exit_code == 2 and "--seed" in res.output and "greater than or equal to 0" in " ".join(res.output.split())
    assert not out.exists()
    (tmp_path / "t.csv").write_text("r,N_once,N_rec,D,loss\n1,1,0,1,1\n")
    res = CliRunner().invoke(app, ["fit", str(tmp_path / "t.csv"), "--seed", "-1"])
    assert res.exit_code == 2 and "greater than or equal to 0" in " ".join(res.output.split())


def test_a_report_kept_by_a_refit_still_shows_the_lr_figures(tmp_path):
    """A refit moves fit/, report.md and loss_vs_compute.png into earlier_fit_<time>/; the kept report's links to
    tune_lr/loss_vs_lr_size*.png, which stay in the run folder, pointed at nothing. They now go one folder up;
    links into what moved with the report stay."""
    from loopscale.sweep.store import relink_moved_report

    (tmp_path / "tune_lr").mkdir()
    (tmp_path / "tune_lr" / "loss_vs_lr_size16.png").write_bytes(b"png")
    aside = tmp_path / "earlier_fit_20261203T120000"
    (aside / "fit" / "baseline").mkdir(parents=True)
    (aside / "fit" / "baseline" / "fit_curves.png").write_bytes(b"png")
    (aside / "loss_vs_compute.png").write_bytes(b"png")
    (aside / "report.md").write_text("# r\n\n![loss_vs_lr_size16](tune_lr/loss_vs_lr_size16.png)\n\n![loss vs compute]"
                                     "(loss_vs_compute.png)\n\n![data and fitted curves](fit/baseline/fit_curves.png)\n")  # fmt: skip
    relink_moved_report(aside / "report.md", ["fit", "report.md", "loss_vs_compute.png"])
    text = (aside / "report.md").read_text()
    links = [ln.split("](", 1)[1].rstrip(")") for ln in text.splitlines() if ln.startswith("![")]
    assert links == ["../tune_lr/loss_vs_lr_size16.png", "loss_vs_compute.png", "fit/baseline/fit_curves.png"]
    assert all((aside / link).resolve().is_file() for link in links)
    relink_moved_report(aside / "missing.md", ["fit"])  # no report: nothing to do


def test_a_refit_moves_the_edited_reports_with_the_fit_they_describe(tmp_path):
    """An edited report kept beside report.md (report_edited_*.md, report_previous_*.md) stayed in the run folder
    when a refit or --force moved the fit aside, where its links then showed the new fit's figures beside notes on
    the old one. It moves with the fit, relinked as report.md is; one in another encoding moves byte for byte."""
    from loopscale.sweep.store import move_report_outputs

    out = tmp_path / "run"
    (out / "tune_lr").mkdir(parents=True)
    (out / "fit").mkdir()
    (out / "loss_vs_compute.png").write_bytes(b"png")
    page = "# r\n\n![lr](tune_lr/loss_vs_lr_size16.png)\n\n![loss vs compute](loss_vs_compute.png)\n"
    (out / "report.md").write_text(page, encoding="utf-8")
    (out / "report_edited_20261206T120000.md").write_text(page + "my note\n", encoding="utf-8")
    latin1 = page.encode("utf-8") + b"caf\xe9\n"
    (out / "report_previous_20261206T120000.md").write_bytes(latin1)
    aside = out / "earlier_fit_20261206T130000"
    aside.mkdir()
    moved = move_report_outputs(out, aside)
    assert moved == ["fit", "report.md", "loss_vs_compute.png", "report_edited_20261206T120000.md",
                     "report_previous_20261206T120000.md"]  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["earlier_fit_20261206T130000", "tune_lr"]
    for name in ("report.md", "report_edited_20261206T120000.md"):
        text = (aside / name).read_text(encoding="utf-8")
        assert "](../tune_lr/loss_vs_lr_size16.png)" in text and "](loss_vs_compute.png)" in text
    assert (aside / "report_previous_20261206T120000.md").read_bytes() == latin1


def test_a_dry_run_refuses_the_storage_run_refuses(tmp_path, monkeypatch):
    """`run --dry-run --storage s3://<a bucket out of reach>` (or a local storage under a file) said `refused:
    None`, exit 0, and `run` refused it at once, exit 2. The dry run now checks the storage as `run` does before
    it writes anything (a local one: creating nothing)."""
    from typer.testing import CliRunner

    from loopscale.cluster import options
    from loopscale.sweep.cli import app

    def out_of_reach(storage, *, write=False):
        if storage and storage.startswith("s3://"):
            raise ValueError(f"storage {storage!r} cannot be reached: no network")

    monkeypatch.setattr(options, "reachable_storage", out_of_reach)
    (tmp_path / "a_file").write_text("x")
    for storage, said in (("s3://no-such-bucket/x", "cannot be reached: no network"),
                          (str(tmp_path / "a_file" / "st"),
                           f"storage (--storage, or the spec's storage_path) {tmp_path / 'a_file' / 'st'} cannot be "
                           f"created: {tmp_path / 'a_file'} is a file; give a directory (new or existing)")):  # fmt: skip
        out = tmp_path / "o"
        res = CliRunner().invoke(app, ["run", "--preset", "smoke", "--out", str(out), "--dry-run", "--json",
                                       "--storage", storage])  # fmt: skip
        assert res.exit_code == 2, res.output
        assert said in json.loads(res.stdout.splitlines()[0])["refused"]
        assert not out.exists() and not (tmp_path / "st").exists()
    res = CliRunner().invoke(app, ["run", "--preset", "smoke", "--out", str(tmp_path / "o"), "--dry-run", "--json",
                                   "--storage", str(tmp_path / "new" / "st")])  # fmt: skip
    assert res.exit_code == 0 and json.loads(res.stdout.splitlines()[0])["refused"] is None
    assert not (tmp_path / "new").exists()  # a dry run creates nothing


def test_a_console_dry_run_says_a_refusal_once(tmp_path):
    """The console plan printed a refusal's text twice, as `refused: <text>` in the table and as the error line
    after it. The table now points to the error line, which gives the text once; --json keeps it in `refused`."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    (tmp_path / "a_file").write_text("x")
    storage = str(tmp_path / "a_file" / "st")
    res = CliRunner().invoke(app, ["run", "--preset", "smoke", "--out", str(tmp_path / "o"), "--dry-run",
                                   "--storage", storage])  # fmt: skip
    assert res.exit_code == 2, res.output
    said = f"{tmp_path / 'a_file'} is a file"
    flat = " ".join(res.output.split())
    assert flat.count(said) == 1 and "error: run would refuse this spec: storage" in flat, res.output
    assert "refused: yes: the error below says why" in flat


def test_a_dry_run_on_a_folder_with_recorded_runs_says_what_is_left_to_train(half_done, tmp_path):
    """A dry run on a folder whose runs are partly recorded planned every run as if none were: it now says how many
    are recorded, how many finished runs `run` will record without training (their result.json in the storage), and
    what is left to train (runs, trials, FLOPs), as `run` continues. A failed record is left to train (retried)."""
    import time

    from loopscale.model.train import resolve_tokens
    from loopscale.sweep.grid import trial_groups
    from loopscale.sweep.store import ResultsStore, run_record

    out, cells = half_done  # 5 ok, 1 diverged, 2 failed (cells 6, 7), 8 untouched
    spec = preset_spec("smoke")
    finished = out / "tune" / "checkpoints" / cells[8].run_id
    finished.mkdir(parents=True)
    (finished / "result.json").write_text("{}")
    before = _tree(out)
    res = _dry(out)
    assert res.returncode == 0, res.stderr
    p = json.loads(res.stdout)
    left = cells[6:8] + cells[9:]
    f_left = sum(flops_per_token(c.run.model) * resolve_tokens(c.run) for c in left)
    f_all = sum(flops_per_token(c.run.model) * resolve_tokens(c.run) for c in cells)
    n_trials = len(trial_groups(left, spec.ensemble_members()))
    assert p["recorded"] == (
        f"6 of 16 runs recorded (ok, diverged or did not learn), 1 more finished and are recorded when `run` "
        f"continues; 9 left to train in {n_trials} trials, {f_left:.3g} of the grid's {f_all:.3g} training FLOPs "
        f"({f_left / f_all:.0%})"
    )
    assert p["runs"] == 16 and _tree(out) == before  # the plan is still the whole grid's; nothing written
    store = ResultsStore(out)
    for c in cells[6:]:
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}, finished_at=time.time() + 1))
    p = json.loads(_dry(out).stdout)
    assert p["recorded"] == ("16 of 16 runs recorded; nothing left to train (`run` fits and reports, unless they are "
                             "up to date)")
    assert json.loads(_dry(tmp_path / "new").stdout)["recorded"] is None


def test_a_dry_run_with_lr_tune_and_no_lr_table_yet_says_the_grid_is_not_defined(tmp_path):
    """With `lr: tune` the grid's runs include their tuned LR: before the LR table exists the note says LR tuning
    runs first instead of counting runs of a grid that is not defined yet."""
    import time

    from loopscale.sweep.spec import spec_to_yaml
    from loopscale.sweep.store import ResultsStore, run_record

    spec = preset_spec("smoke")
    tuned = spec.model_copy(update={"lr": "tune"})
    out = tmp_path / "run"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(tuned))
    ResultsStore(out).write_run(run_record(spec.cells()[0], {"status": "ok", "final_val_loss": 3.0},
                                           finished_at=time.time()))  # fmt: skip
    res = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", str(out / "spec.yaml"), "--dry-run",
                          "--json", "--out", str(out)], capture_output=True, text=True, timeout=120)  # fmt: skip
    p = json.loads(res.stdout)
    assert p["recorded"] == ("1 finished run record, but no LR table yet: LR tuning runs first, then the grid (its "
                             "runs' LR is part of their definition)"), p


def test_a_dry_run_given_a_relative_out_lists_an_unreadable_file_once(tmp_path):
    """`run --dry-run --out P2` on a folder with a torn runs.parquet listed it twice, as P2/runs.parquet and as its
    absolute path (the count of recorded runs read the folder by its absolute path)."""
    import shutil

    shutil.copytree("docs/example_cpu_seeds4", tmp_path / "P2")
    (tmp_path / "P2" / "runs.parquet").write_bytes(b"torn")
    res = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", "P2/spec.yaml", "--out", "P2",
                          "--dry-run", "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    p = json.loads(res.stdout)
    assert [u.split(" is unreadable")[0] for u in p["unreadable"]] == ["P2/runs.parquet"], p["unreadable"]


def test_a_dry_run_lists_a_torn_spec_yaml_that_run_sets_aside(tmp_path):
    """A folder whose spec.yaml is cut short takes the spec its runs are cells of, and `run` keeps the torn file
    aside before writing its own; the dry run did not say so. It lists it now, and still moves nothing."""
    import shutil

    out = tmp_path / "s4"
    shutil.copytree("docs/example_cpu_seeds4", out)
    spec_text = (out / "spec.yaml").read_text()
    shutil.copy(out / "spec.yaml", tmp_path / "spec.yaml")
    (out / "spec.yaml").write_text(spec_text[:60])
    before = _tree(out)
    res = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", str(tmp_path / "spec.yaml"), "--out",
                          str(out), "--dry-run", "--json"], capture_output=True, text=True, timeout=120)  # fmt: skip
    p = json.loads(res.stdout)
    assert p["refused"] is None and _tree(out) == before
    assert p["unreadable"] == [f"{out / 'spec.yaml'} is unreadable (not a spec this loopscale reads: cut short, "
                               "edited, or another tool's file): the command would move it aside and treat it as "
                               "missing"], p["unreadable"]  # fmt: skip


def test_the_dry_run_says_how_much_lr_tuning_an_earlier_command_finished(tmp_path):
    """A folder whose LR tuning stopped part-way (one of two studies done, two of the other's four trials in the
    Optuna storage, no LR table): the dry run says what `run` tunes before the grid (it said nothing); with every
    study done, that the table is written from them; a folder with an LR table, or with no tuning, says nothing."""
    import optuna
    from tiny_spec import tiny_spec
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app
    from loopscale.sweep.spec import parse_spec, spec_to_yaml

    spec = parse_spec(tiny_spec(lr="tune", tune={"num_samples": 4, "tokens": 2048}))
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(spec), encoding="utf-8")
    out = tmp_path / "out"

    def said() -> str | None:
        res = CliRunner().invoke(app, ["run", str(spec_file), "--out", str(out), "--dry-run", "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["lr_tuning_done"]

    assert said() is None  # a new folder
    done = out / "tune_lr" / "done"
    done.mkdir(parents=True)
    (out / "spec.yaml").write_text(spec_to_yaml(spec), encoding="utf-8")
    assert said() is None  # the tuning not begun
    (done / "size16_r1.json").write_text(json.dumps({"study_name": "tiny_size16_r1"}), encoding="utf-8")
    assert said() == ("1 of 2 LR studies finished here; `run` tunes the other 1, then writes the LR table and "
                      "trains the grid")  # fmt: skip
    study = optuna.create_study(study_name="tiny_size16_r2", storage=f"sqlite:///{out / 'tune_lr' / 'optuna.db'}")
    dist = {"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)}
    for lr in (0.01, 0.03):
        study.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=dist, value=3.0))
    assert said() == ("1 of 2 LR studies finished here; `run` tunes the other 1 (2 of its 4 trials finished "
                      "earlier: their results are reused, not trained again; --resume restores the stopped study as "
                      "it stopped), then writes the LR table and "
                      "trains the grid")  # fmt: skip
    left = json.loads(CliRunner().invoke(app, ["run", str(spec_file), "--out", str(out), "--dry-run", "--json"]).stdout)
    assert (left["lr_trials"], left["lr_trials_left"]) == (8, 2)  # the whole tuning's, and the 4 - 2 left to train
    # `sweep` there names the folder's spec and --resume (it said `loopscale tune-lr SPEC --out ...` first)
    sw = CliRunner().invoke(app, ["sweep", str(spec_file), "--out", str(out)])
    assert sw.exit_code == 2, sw.output
    assert (f"make it with `loopscale tune-lr {out / 'spec.yaml'} --out {out} --resume` first (1 of 2 LR studies "
            "finished here, and 2 trials of the others), or use `loopscale run`") in " ".join(sw.output.split())
    (done / "size16_r2.json").write_text(json.dumps({"study_name": "tiny_size16_r2"}), encoding="utf-8")
    assert said() == ("all 2 LR studies finished here; `run` writes the LR table from them, training no LR trial "
                      "again, then trains the grid")  # fmt: skip
    from loopscale.sweep.lr_table import _lr_table_schema
    from loopscale.sweep.store import to_table, write_table_atomic

    rows = [dict(size=16, r=r, tuned_r=r, N_unique=1000, N_usage=1000, lr_best=0.02, best_val_loss=3.25,
                 lr_smoothed=0.02, lr=0.02, n_trials=4, n_pruned=0, budget_tokens=2048, study_name=f"tiny_size16_r{r}",
                 storage="sqlite:///x") for r in (1, 2)]  # fmt: skip
    write_table_atomic(to_table(rows, _lr_table_schema()), out / "lr_table.parquet")
    assert said().startswith("lr_table.parquet exists here: `run` skips LR tuning and trains the grid at its LRs")
    # the LR-cost warning of a tuning that will not run is dropped (it warned of 8x the grid's FLOPs there)
    with_cost = parse_spec(tiny_spec(lr="tune", tune={"num_samples": 4, "tokens": 200_000}))
    spec_file.write_text(spec_to_yaml(with_cost), encoding="utf-8")
    (out / "spec.yaml").write_text(spec_to_yaml(with_cost), encoding="utf-8")
    fresh = CliRunner().invoke(app, ["run", str(spec_file), "--out", str(tmp_path / "new"), "--dry-run", "--json"])
    assert json.loads(fresh.stdout)["lr_warning"].startswith("LR tuning may cost up to")
    tuned = CliRunner().invoke(app, ["run", str(spec_file), "--out", str(out), "--dry-run", "--json"])
    assert tuned.exit_code == 0, tuned.output
    assert json.loads(tuned.stdout)["lr_warning"] is None


def test_the_dry_run_of_a_half_tuned_folder_weighs_the_lr_studies_left(tmp_path):
    """With one of two LR studies done, the dry run's LR-cost warning still counted both studies' FLOPs; it now
    counts the study left (its ratio to the grid's FLOPs is that study's alone), and ``lr_trials_left`` gives its
    trials, while ``lr_trials`` and ``lr_flops_max`` stay the whole tuning's."""
    from tiny_spec import tiny_spec
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app
    from loopscale.sweep.run import lr_study_flops
    from loopscale.sweep.spec import parse_spec, spec_to_yaml

    spec = parse_spec(tiny_spec(lr="tune", tune={"num_samples": 4, "tokens": 200_000}))
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(spec), encoding="utf-8")
    out = tmp_path / "out"

    def dry(folder) -> dict:
        res = CliRunner().invoke(app, ["run", str(spec_file), "--out", str(folder), "--dry-run", "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    whole = dry(tmp_path / "new")
    assert whole["lr_warning"].startswith("LR tuning may cost up to") and "lr_trials_left" not in whole
    (out / "tune_lr" / "done").mkdir(parents=True)
    (out / "spec.yaml").write_text(spec_to_yaml(spec), encoding="utf-8")
    (out / "tune_lr" / "done" / "size16_r2.json").write_text(json.dumps({"study_name": "tiny_size16_r2"}))
    half = dry(out)
    assert (half["lr_trials"], half["lr_trials_left"], half["lr_flops_max"]) == (8, 4, whole["lr_flops_max"])
    rest = lr_study_flops(spec, 16, 1)
    assert 0 < rest < whole["lr_flops_max"]
    grid = half["train_flops_total"]
    assert half["lr_warning"] == (f"The 1 LR study left may cost up to {rest / grid:.3g}x the grid's training FLOPs "
                                  f"({rest:.3g} against {grid:.3g}; every trial trained to its full budget, ASHA "
                                  "stops some early): lower tune.tokens (or tune.tokens_per_param) or "
                                  "tune.num_samples, or fix lr")  # fmt: skip
    # two of that study's four trials finished: half its FLOPs are left, and the warning says how many trials
    import optuna

    study = optuna.create_study(study_name="tiny_size16_r1", storage=f"sqlite:///{out / 'tune_lr' / 'optuna.db'}")
    dist = {"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)}
    for lr in (0.01, 0.03):
        study.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=dist, value=3.0))
    part = dry(out)
    assert part["lr_trials_left"] == 2
    assert part["lr_warning"].startswith(f"The 1 LR study left (2 trials to train) may cost up to "
                                         f"{rest / 2 / grid:.3g}x the grid's training FLOPs ({rest / 2:.3g} against")
    for lr in (0.1, 0.3):
        study.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=dist, value=3.0))
    done = dry(out)  # every trial finished, its done marker not yet written: nothing to train, nothing to warn of
    assert (done["lr_trials_left"], done["lr_warning"]) == (0, None)


def test_the_dry_run_names_the_fit_settings_and_where_they_come_from(tmp_path):
    """A tiny custom spec got the paper's B = 200 and 500 starts (a 4.3 min fit after 8 s of training) and the
    dry run said nothing of them; it now gives them and their source."""
    from tiny_spec import tiny_spec
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app
    from loopscale.sweep.spec import parse_spec, spec_to_yaml

    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(parse_spec(tiny_spec())), encoding="utf-8")

    def dry(*extra) -> dict:
        res = CliRunner().invoke(app, ["run", *extra, "--out", str(tmp_path / "o"), "--dry-run", "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    p = dry(str(spec_file))
    assert (p["fit_bootstrap"], p["fit_starts"]) == (200, 500)
    assert p["fit_settings_from"].startswith("the paper's defaults (B = 200, 500 starts), as for every spec not "
                                             "named like a preset; the fit's time grows with B x starts")  # fmt: skip
    p = dry(str(spec_file), "--bootstrap", "40")
    assert (p["fit_bootstrap"], p["fit_starts"]) == (40, 500) and ", with --bootstrap given;" in p["fit_settings_from"]
    p = dry("--preset", "smoke")
    assert (p["fit_bootstrap"], p["fit_starts"]) == (100, 100)
    assert p["fit_settings_from"].startswith("the smoke preset's defaults;")
    assert dry("--preset", "smoke", "--bootstrap", "8", "--starts", "9")["fit_settings_from"] == "--bootstrap and --starts"


def test_the_dry_run_says_whether_the_folders_fit_is_redone(tmp_path):
    """A folder fitted with --bootstrap 100 --starts 100 was refitted by a plain `run --resume` at the defaults
    (B = 200, 500 starts) for minutes, and its dry run said only "nothing left to train (`run` fits and reports,
    unless they are up to date)". The dry run's fit_stage now names the settings that differ and the options that
    keep them, or says the fit is up to date; nothing for a folder without a finished fit."""
    import pandas as pd

    from loopscale.fit.analysis import FIT_RULES_VERSION, file_digest
    from loopscale.sweep.run import _fit_stage_note

    out = tmp_path / "run"
    (out / "fit").mkdir(parents=True)
    planned = {"B": 200, "starts": 500, "seed": 0}
    assert _fit_stage_note(out, planned, trains=False) is None  # no run_meta.json
    pd.DataFrame({"r": [1, 2]}).to_parquet(out / "runs.parquet")
    fit_input = {"runs_sha256": file_digest(out / "runs.parquet"), "B": 100, "starts": 100, "seed": 0,
                 "fit_rules": FIT_RULES_VERSION}  # fmt: skip
    (out / "run_meta.json").write_text(json.dumps({"fit_input": fit_input}))
    assert _fit_stage_note(out, planned, trains=False) is None  # no analysis.json: no finished fit
    (out / "fit" / "analysis.json").write_text("{}")
    note = _fit_stage_note(out, planned, trains=False)
    assert note == ("`run` refits: the folder's fit used B = 100, 100 starts, this command's would use B = 200, 500 "
                    "starts (the earlier fit and its report are moved aside to earlier_fit_*, not replaced); give "
                    "--bootstrap 100 --starts 100 to keep the folder's settings")  # fmt: skip
    assert _fit_stage_note(out, {**planned, "starts": 100, "seed": 3}, trains=False).endswith(
        "used B = 100, seed 0, this command's would use B = 200, seed 3 (the earlier fit and its report are moved "
        "aside to earlier_fit_*, not replaced); give --bootstrap 100 --seed 0 to keep the folder's settings")
    same = {"B": 100, "starts": 100, "seed": 0}
    assert _fit_stage_note(out, same, trains=False) == "the folder's fit (B = 100, 100 starts) is up to date: `run` skips it"
    assert _fit_stage_note(out, same, trains=True) is None  # runs to train first: the runs table changes
    # a torn analysis.json: `run` moves it aside and refits (the dry run called that fit up to date)
    (out / "fit" / "analysis.json").write_text('{"variants": ')
    assert _fit_stage_note(out, same, trains=False) == (
        "`run` refits: fit/analysis.json does not read (it is moved aside, and the fit made again)")
    # a fit whose files are not all there (a variant's folder deleted): refitted (it was skipped as up to date, and
    # the report's figures drawn from them stayed missing)
    listed = {"variants": {"baseline": {"files": {"fit.json": "baseline/fit.json", "fit_curves.png": "baseline/f.png"}}}}
    (out / "fit" / "analysis.json").write_text(json.dumps(listed))
    assert _fit_stage_note(out, same, trains=False) == (
        "`run` refits: the folder's fit lacks fit/baseline/fit.json (the earlier fit and its report are moved aside to "
        "earlier_fit_*, not replaced)")
    (out / "fit" / "baseline").mkdir()
    (out / "fit" / "baseline" / "fit.json").write_text("{}")  # a figure missing is the report's to redraw or name
    assert _fit_stage_note(out, same, trains=False).endswith("is up to date: `run` skips it")
    (out / "fit" / "analysis.json").write_text("{}")
    # a fit made under older fit rules: refitted where the rules changed the analysis of these runs (here a table
    # fit_rules_in_effect cannot test), up to date where they did not (one D: version 4 changed designs of two D)
    old_rules = {**fit_input, "fit_rules": FIT_RULES_VERSION - 1}
    (out / "run_meta.json").write_text(json.dumps({"fit_input": old_rules}))
    assert _fit_stage_note(out, same, trains=False) == (
        f"`run` refits: the folder's fit follows fit rules version {FIT_RULES_VERSION - 1}, this loopscale's are "
        f"version {FIT_RULES_VERSION} (the earlier fit and its report are moved aside to earlier_fit_*, not replaced)")
    one_d = pd.DataFrame({"r": [1, 2], "D": [1e6, 1e6], "N_once": [10.0, 5.0], "N_rec": [0.0, 5.0], "status": "ok"})
    one_d.to_parquet(out / "runs.parquet")
    (out / "run_meta.json").write_text(json.dumps(
        {"fit_input": {**old_rules, "runs_sha256": file_digest(out / "runs.parquet")}}))
    assert _fit_stage_note(out, same, trains=False).endswith("is up to date: `run` skips it")
    pd.DataFrame({"r": [1, 2, 4]}).to_parquet(out / "runs.parquet")
    assert _fit_stage_note(out, same, trains=False) is None  # other runs than the fit's
    # the folder's last fit's time (run_meta.json's fit_last) is said beside a refit
    (out / "run_meta.json").write_text(json.dumps({"fit_input": fit_input,
                                                   "fit_last": {"wall_s": 45.0, "B": 100, "starts": 100}}))  # fmt: skip
    pd.DataFrame({"r": [1, 2]}).to_parquet(out / "runs.parquet")
    assert _fit_stage_note(out, planned, trains=False) == (
        "`run` refits: the folder's fit used B = 100, 100 starts, this command's would use B = 200, 500 starts (the "
        "earlier fit and its report are moved aside to earlier_fit_*, not replaced; the folder's last fit took 0.8 "
        "min at B = 100, 100 starts); give --bootstrap 100 --starts 100 to keep the folder's settings")
    (out / "fit" / "analysis.json").write_text('{"variants": ')
    assert _fit_stage_note(out, same, trains=False).endswith(
        "(it is moved aside, and the fit made again; the folder's last fit took 0.8 min at B = 100, 100 starts)")


def test_an_lr_above_one_is_said_before_the_grid_trains():
    """A fixed LR of 30 (a typo for 3e-1, say) was accepted without a word and every run ended diverged or
    did_not_learn. The plan (and `run`/`sweep`, before training) now names the runs above LR 1, the highest and a
    few cells; a table's single high entry is counted alone, and `lr: tune` (LRs not known yet) is silent."""
    from loopscale.sweep.run import plan
    from loopscale.sweep.spec import HIGH_LR, high_lr_warning, parse_spec

    base = {"name": "hi", "model": {"preset": "cpu", "seq_len": 32}, "r": [1, 2], "sizes": [16, 32],
            "tokens": [2048], "training": {"batch_tokens": 256}}  # fmt: skip
    w = plan(parse_spec({**base, "lr": {"fixed": 30}}), data=False)["lr_value_warning"]
    assert w.startswith("4 of 4 runs train at an LR above 1 (highest 30; size 16 r=1 D=2048: 30, size 16 r=2 "
                        "D=2048: 30, size 32 r=1 D=2048: 30, ...)"), w  # fmt: skip
    assert "left out of the fit" in w and "lr: {fixed: ...}" in w
    assert plan(parse_spec({**base, "lr": {"fixed": 0.01}}), data=False)["lr_value_warning"] is None
    assert plan(parse_spec({**base, "lr": {"fixed": HIGH_LR}}), data=False)["lr_value_warning"] is None  # 1 itself
    table = parse_spec({**base, "lr": {"table": {16: 0.01, 32: {1: 0.02, 2: 5.0}}}})
    w = plan(table, data=False)["lr_value_warning"]
    assert w.startswith("1 of 4 runs train at an LR above 1 (highest 5; size 32 r=2 D=2048: 5)"), w
    # seeds of one cell, and two budgets, are named once each, by their D
    seeded = parse_spec({**base, "sizes": [16], "tokens": [2048, 4096], "seeds": 3, "lr": {"fixed": 30}})
    w = plan(seeded, data=False)["lr_value_warning"]
    assert w.startswith("12 of 12 runs train at an LR above 1 (highest 30; size 16 r=1 D=2048: 30, size 16 r=2 "
                        "D=2048: 30, size 16 r=1 D=4096: 30, ...)"), w  # fmt: skip
    tune = parse_spec({**base, "lr": "tune"})
    assert plan(tune, data=False)["lr_value_warning"] is None
    # a ladder's plain models share size 16 and r = 1 with the grid's: named with their layers
    ladder = parse_spec({**base, "sizes": [16], "ladder": [2, 3], "lr": {"fixed": 30}})
    w = plan(ladder, data=False)["lr_value_warning"]
    depth = ladder.cells()[0].run.model.effective_depth
    assert w.startswith(f"4 of 4 runs train at an LR above 1 (highest 30; size 16 r=1 ({depth} layers) D=2048: 30, "
                        "size 16 r=2 D=2048: 30, size 16 r=1 (2 layers) D=2048: 30, ...)"), w  # fmt: skip
    # a tune range wholly above 1: every trial would diverge or not learn (one reaching below 1 is not said)
    above = parse_spec({**base, "lr": "tune", "tune": {"lr_min": 3, "lr_max": 30}})
    w = plan(above, data=False)["lr_value_warning"]
    assert w.startswith("every LR trial trains at an LR above 1 (tune.lr_min starts at 3)") and w.endswith(
        "Check tune's LR range (the default is [0.0001, 0.1])"), w
    values = parse_spec({**base, "lr": "tune", "tune": {"lr_values": [2, 4, 8]}})
    assert "(tune.lr_values starts at 2)" in plan(values, data=False)["lr_value_warning"]
    reaching = parse_spec({**base, "lr": "tune", "tune": {"lr_min": 0.5, "lr_max": 30}})
    assert plan(reaching, data=False)["lr_value_warning"] is None
    assert high_lr_warning([]) is None


def test_an_lr_study_whose_asha_compares_after_a_few_steps_is_said():
    """tune.tokens 2048 at batch 256 (8 steps, 4 milestones) let ASHA stop LRs after 2 optimizer steps without a word,
    where trials rank by their first steps' speed (the highest LRs first). The plan names the study where the first
    rung comes soonest, with its steps worked out here; none for a first rung at 48 steps or more, for ASHA without
    an early rung (grace = all milestones) or a fixed LR."""
    from loopscale.sweep.lr_search import MIN_RUNG_STEPS, early_rung_warning
    from loopscale.sweep.spec import parse_spec

    base = {"name": "rung", "model": {"preset": "cpu", "seq_len": 32}, "r": [1, 2], "sizes": [16, 32],
            "tokens": [8192], "training": {"batch_tokens": 256}, "lr": "tune"}  # fmt: skip
    tiny = parse_spec({**base, "tune": {"tokens": 2048, "num_milestones": 4}})
    w = plan(tiny, data=False)["lr_rung_warning"]
    assert w.startswith("ASHA first compares the trials of 4 of 4 LR studies after fewer than 48 optimizer steps "
                        "(size 16, r 1: after 2 steps, tune.grace_milestones = 1 x 2 steps per milestone)"), w
    assert "Raise tune.grace_milestones (set to tune.num_milestones, 4, ASHA stops no trial early)" in w
    graced = parse_spec({**base, "tune": {"tokens": 2048, "num_milestones": 4, "grace_milestones": 3}})
    assert "(size 16, r 1: after 6 steps, tune.grace_milestones = 3 x 2 steps per milestone)" in early_rung_warning(graced)
    # 48 steps per milestone: 2 milestones of 48 steps of 256 tokens
    enough = parse_spec({**base, "tune": {"tokens": 2 * MIN_RUNG_STEPS * 256, "num_milestones": 2}})
    assert enough.tuning_steps(16, 1) == (2 * MIN_RUNG_STEPS, MIN_RUNG_STEPS)
    assert plan(enough, data=False)["lr_rung_warning"] is None
    one_less = parse_spec({**base, "tune": {"tokens": 2 * (MIN_RUNG_STEPS - 1) * 256, "num_milestones": 2}})
    assert "after 47 steps" in early_rung_warning(one_less)
    no_early_stop = parse_spec({**base, "tune": {"tokens": 2048, "num_milestones": 4, "grace_milestones": 4}})
    assert early_rung_warning(no_early_stop) is None
    assert early_rung_warning(parse_spec({**base, "lr": {"fixed": 0.01}})) is None
    assert plan(preset_spec("paper"), data=False)["lr_rung_warning"] is None  # 169 steps per milestone and more
