"""Sweep spec: presets round-trip through YAML, the grid has the right cells, bad specs fail naming the key."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from loopscale.sweep.presets import PRESETS, preset_spec
from loopscale.sweep.spec import SpecError, SweepSpec, load_spec, parse_spec, run_id

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["smoke", "cpu", "paper"])
def test_config_yaml_equals_preset(name):
    """configs/X.yaml and preset_spec('X') are the same spec."""
    assert load_spec(ROOT / "configs" / f"{name}.yaml") == preset_spec(name)


def test_smoke_has_16_cells_over_r_sizes_budgets():
    cells = preset_spec("smoke").cells()
    assert len(cells) == 16
    assert sorted({c.r for c in cells}) == [1, 2, 4, 8]
    assert sorted({c.size for c in cells}) == [16, 32]
    assert sorted({c.run.tokens for c in cells}) == [2048, 4096]
    assert len({c.run_id for c in cells}) == 16
    for c in cells:
        m = c.run.model
        assert m.effective_depth == 10 and m.r == c.r and m.d_model == c.size
        assert c.lr == 0.01


def test_paper_grid_is_116_runs_with_paper_budgets():
    """Paper Sec. 3.2: 29 (C, s) cells x 4 r = 116 runs, d = 64 s, batch 2^18, T = 2048, depth 2+16/r*r+2."""
    spec = preset_spec("paper")
    table = {(s, r): 0.014 for s in spec.all_sizes() for r in spec.r}
    cells = spec.cells(lr_table=table)
    assert len(cells) == 116
    assert len({(c.budget, c.size) for c in cells}) == 29
    c = next(c for c in cells if c.size == 10 and c.r == 4 and c.budget == 1e18)
    m = c.run.model
    assert (m.d_model, m.n_prelude, m.n_recur_block, m.n_coda, m.seq_len) == (640, 2, 4, 2, 2048)
    # the paper's optimizer: MuonH with Polar Express (the preset trained plain Newton-Schulz Muon before)
    assert c.run.batch_tokens == 2**18 and c.run.optimizer == "muonh" and c.run.orthogonalization == "polar_express"
    assert c.run.weight_decay == 0.0
    assert c.run.target_flops == 1e18 and c.run.tokens is None
    assert spec.tune.lr_values == [0.008, 0.010, 0.012, 0.014, 0.016, 0.018, 0.020, 0.024]


def test_run_ids_of_the_presets_stay_those_of_runs_recorded_before_orthogonalization_was_a_field():
    """Run ids are hashes of the run definition; adding the (default Newton-Schulz) ``orthogonalization`` field must
    not change them, or every folder trained before would be retrained. Pinned ids were computed by the version
    before the field existed."""
    cpu = preset_spec("cpu").cells()
    smoke = preset_spec("smoke").cells()
    assert (cpu[0].run_id, cpu[-1].run_id) == ("d2b4f7845b0609e5", "126a8fe4f87f5551")
    assert (smoke[0].run_id, smoke[-1].run_id) == ("852cb8a6df085fba", "4c488052b3766c6f")


def test_muonh_weight_decay_and_adamw_orthogonalization_are_refused_by_the_spec():
    d = copy.deepcopy(PRESETS["smoke"])
    d["training"] = {**d.get("training", {}), "optimizer": "muonh", "weight_decay": 0.1}
    with pytest.raises(SpecError, match="MuonH has no weight decay"):
        parse_spec(d)
    d["training"].update(optimizer="adamw", weight_decay=0.0, orthogonalization="polar_express")
    with pytest.raises(SpecError, match="needs optimizer 'muon' or 'muonh'"):
        parse_spec(d)
    d["training"].update(optimizer="muonh", orthogonalization="polar")
    with pytest.raises(SpecError, match="training.orthogonalization"):
        parse_spec(d)
    d["training"].update(orthogonalization="polar_express")
    assert {c.run.orthogonalization for c in parse_spec(d).cells()} == {"polar_express"}


def test_paper_preset_transfers_the_tuned_muon_lr_to_each_budget_by_the_papers_data_exponent(tmp_path):
    """The paper multiplies the Muon LR by (D / D_ref)^-0.32 per run (HyperP); the preset tuned one LR per (s, r)
    and trained every budget at it. Now each run's matrix LR is lr * (D / D_ref)^-0.32 with D_ref the tuning
    tokens, 10 x (N_once + r N_rec): at s = 10 that is 0.98 B tokens for r = 1, the paper's D_ref (0.983 B), and
    1.02 B for r = 4 (the paper's 1.016 B). The LR trials themselves train at D_ref, with no factor."""
    from loopscale.model.accounting import n_once, n_rec
    from loopscale.model.train import resolve_tokens
    from loopscale.sweep.lr_search import study_plan

    spec = preset_spec("paper")
    assert spec.lr_data_exponent == 0.32
    table = {(s, r): 0.014 for s in spec.all_sizes() for r in spec.r}
    cells = {(c.budget, c.size, c.r): c for c in spec.cells(lr_table=table)}
    for r, want_ref in ((1, 0.9836e9), (4, 1.0171e9)):
        c = cells[(4.64e18, 10, r)]
        m = c.run.model
        assert spec.lr_reference_tokens(10, r) == pytest.approx(10 * (n_once(m) + r * n_rec(m)), rel=2e-3)
        assert spec.lr_reference_tokens(10, r) == pytest.approx(want_ref, rel=1e-4)
        D = resolve_tokens(c.run)
        assert D == pytest.approx(4.5e9, rel=0.02)
        assert c.run.lr == 0.014  # the tuned LR is recorded as such; the factor is its own field
        assert c.run.lr_data_factor == pytest.approx((D / want_ref) ** -0.32, rel=1e-4)
    assert cells[(4.64e18, 10, 4)].run.lr_data_factor == pytest.approx(0.6245, abs=1e-4)
    assert cells[(4.64e17, 10, 1)].run.lr_data_factor == pytest.approx(1.283, abs=1e-3)  # D < D_ref: a larger LR
    plan = study_plan(spec, 10, 4, tmp_path / "t", str(tmp_path / "st"), experiment="e")
    assert plan["param_space"]["base"]["run"]["lr_data_factor"] == 1.0
    # without the exponent (every other preset) every run's factor is 1, and not part of its id (pinned above)
    assert {c.run.lr_data_factor for c in preset_spec("cpu").cells()} == {1.0}


def test_lr_data_exponent_needs_a_muon_optimizer():
    d = copy.deepcopy(PRESETS["smoke"])
    d["lr_data_exponent"] = 0.32
    d["training"] = {**d.get("training", {}), "optimizer": "adamw"}
    with pytest.raises(SpecError, match="lr_data_exponent=0.32 scales the Muon matrix LR"):
        parse_spec(d)
    d["training"]["optimizer"] = "muonh"
    got = parse_spec(d).cells()
    assert len({c.run.lr_data_factor for c in got}) == 2  # two token budgets, two factors
    for bad in (-0.3, 2.5):
        d["lr_data_exponent"] = bad
        with pytest.raises(SpecError, match="lr_data_exponent"):
            parse_spec(d)


def test_variants_share_r1_runs_and_set_bptt_and_lanes():
    d = copy.deepcopy(PRESETS["smoke"])
    d["variants"] = ["baseline", "trunc_bptt", {"name": "hyperconnect", "hc_lanes": 3}]
    cells = parse_spec(d).cells()
    r1 = [c for c in cells if c.r == 1]
    assert len(r1) == 4 and {c.variant for c in r1} == {"baseline"}
    assert len(cells) == 4 + 3 * 12
    tb = [c for c in cells if c.variant == "trunc_bptt"]
    assert {(c.r, c.run.model.bptt_k) for c in tb} == {(2, 1), (4, 2), (8, 4)}
    hc = [c for c in cells if c.variant == "hyperconnect"]
    assert all(c.run.model.injection == "hyperconnect" and c.run.model.hc_lanes == 3 for c in hc)


def test_run_id_is_stable_and_sensitive():
    a = preset_spec("smoke").cells()
    b = preset_spec("smoke").cells()
    assert [c.run_id for c in a] == [c.run_id for c in b]
    assert run_id(a[0].to_dict()) == a[0].run_id
    d = copy.deepcopy(PRESETS["smoke"])
    d["lr"] = {"fixed": 0.02}
    assert parse_spec(d).cells()[0].run_id != a[0].run_id
    d = copy.deepcopy(PRESETS["smoke"])
    d["seeds"] = [1]
    assert parse_spec(d).cells()[0].run_id != a[0].run_id
    # things that do not define the run leave the id alone
    d = copy.deepcopy(PRESETS["smoke"])
    d["resources"] = {"cpus": 2}
    d["training"]["checkpoint_every_steps"] = 7
    assert parse_spec(d).cells()[0].run_id == a[0].run_id


def test_lr_table_policy():
    d = copy.deepcopy(PRESETS["smoke"])
    d["lr"] = {"table": {16: 0.02, 32: {1: 0.01, 2: 0.005, 4: 0.004, 8: 0.003}}}
    cells = parse_spec(d).cells()
    assert {c.lr for c in cells if c.size == 16} == {0.02}
    assert {(c.r, c.lr) for c in cells if c.size == 32} == {(1, 0.01), (2, 0.005), (4, 0.004), (8, 0.003)}
    d["lr"] = "tune"
    with pytest.raises(SpecError, match="tune-lr"):
        parse_spec(d).cells()


@pytest.mark.parametrize(
    "lr, where",
    [
        ({"table": {16: 0.02, 32: 0}}, r"lr\.table\[32\] must be a positive number, got 0"),
        ({"table": {16: 0.02, 32: None}}, r"lr\.table\[32\] must be a positive number, got None"),
        ({"table": {16: [0.02], 32: 0.01}}, r"lr\.table\[16\] must be a positive number, got \[0\.02\]"),
        ({"table": {16: 0.02, 32: {1: "x", 2: 0.1, 4: 0.1, 8: 0.1}}}, r"lr\.table\[32\]\[1\] .* got 'x'"),
        ({"fixed": True}, "lr.fixed must be a positive number, got True"),
        ({"fixed": float("nan")}, "lr.fixed must be a positive number, got nan"),
    ],
)
def test_lr_that_is_not_a_positive_number_is_refused_naming_the_entry(lr, where):
    """An LR of 0, null, a list, a string, YAML ``true`` or ``.nan`` is refused by the spec, naming the entry (it
    raised a TypeError traceback, 'could not convert string to float', or trained at LR 0 or 1.0)."""
    d = copy.deepcopy(PRESETS["smoke"])
    d["lr"] = lr
    with pytest.raises(SpecError, match=where):
        parse_spec(d)


def _bad(mutate):
    d = copy.deepcopy(PRESETS["smoke"])
    mutate(d)
    return d


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda d: d.update(r=[1, 3]), "r"),
        (lambda d: d.update(r=[]), "r"),
        (lambda d: d.update(sizes=[]), "sizes"),
        (lambda d: d.update(tokens=[]), "tokens"),
        (lambda d: d.update(tokens=[0, 4096]), "tokens"),
        (lambda d: d.update(sizes=[], tokens=None, budgets={-1.0: [16]}), "budgets"),
        (lambda d: d.update(sizes=[], tokens=None, budgets={}), "budgets"),
        (lambda d: d["model"].update(preset="gpt5"), "model.preset"),
        (lambda d: d.update(learning_rate=0.1), "learning_rate"),
        (lambda d: d["training"].update(batch_tokens=0), "training.batch_tokens"),
        (lambda d: d.update(variants=["loopy"]), "variants"),
        (lambda d: d.update(sizes=[20]), "size"),
        (lambda d: d["tune"].update(lr_min=1.0, lr_max=0.1), "tune.lr_min"),
        # a name that is a path: it trained all runs, then failed naming the Tune experiment (compute lost)
        (lambda d: d.update(name="../../evil"), "name: must be 1-100 letters"),
        (lambda d: d.update(name="my run"), "name: must be"),
        (lambda d: d.update(tokenizer="bpe:10"), "tokenizer: tokenizer 'bpe:<vocab_size>' needs 260 <= vocab_size"),
        (lambda d: d.update(lr="tuen"), "lr: must be 'tune', {fixed: LR} or {table: ...}, got 'tuen'"),
        # a fractional count was a pydantic union error naming list[int] and dict[int, list[int]]
        (lambda d: d.update(seeds=2.5), "seeds: seeds must be a count (an integer >= 1, e.g. 4 for [0, 1, 2, 3]) "
                                        "or a list of integer seeds (or a mapping r -> either); got 2.5"),
        (lambda d: d.update(seeds={1: 2, 2: "two"}), "seeds[2] must be a count"),
        # one LR listed twice tuned nothing (a repeat is one grid point); a range that leaves the values out was
        # ignored without a word (the values replace it)
        (lambda d: d["tune"].update(lr_values=[0.01, 0.01]), "tune.lr_values [0.01, 0.01] holds one LR: there is "
                                                             "nothing to tune; give two or more, or fix it with lr: "
                                                             "{fixed: 0.01}"),
        (lambda d: d["tune"].update(lr_values=[0.01, 0.02], lr_min=0.5, lr_max=0.9),
         "tune.lr_values [0.01, 0.02] replaces the range [lr_min, lr_max] = [0.5, 0.9], which leaves out [0.01, 0.02]"),
        # a count of 10**20 (a typo) ended in an OverflowError traceback; a seed past 2**63 overflowed inside torch
        (lambda d: d.update(seeds=10**20), "seeds: seeds as a count must be in [1, 100000]"),
        (lambda d: d.update(seeds=[0, 2**64]), "seeds must be distinct integers in [0, 4294967295], got [0, "),
        # a NaN LR failed inside Ray (and the command still exited 0); an infinite bound crashed the sampler
        (lambda d: d["tune"].update(lr_values=[0.01, float("nan")]), "tune.lr_values must be a non-empty list of finite"),
        (lambda d: d["tune"].update(lr_max=float("inf")), "tune.lr_max must be a finite LR, got inf"),
        # a per-r LR table missing an r of the grid was found when the cells were built, without the spec prefix
        (lambda d: d.update(sizes=[16], lr={"table": {16: {1: 0.01, 2: 0.01}}}),
         "lr.table[16] has no entry for r = 4, 8; it gives r = 1, 2 and the grid has r = [1, 2, 4, 8]"),
        # a repeated size or D was dropped without a word (repeated r, seeds and ladder values were refused)
        (lambda d: d.update(sizes=[16, 16]), "sizes must hold distinct values, got [16, 16] (16 twice)"),
        # two lane counts of hyperconnect were refused without saying which name repeats or why
        (lambda d: d.update(variants=["baseline", {"name": "hyperconnect", "hc_lanes": 2},
                                      {"name": "hyperconnect", "hc_lanes": 4}]),
         "variants must be distinct, got ['baseline', 'hyperconnect', 'hyperconnect']: each name once, "
         "['hyperconnect'] listed more than once (hyperconnect takes one hc_lanes per spec: compare lane counts in "
         "separate --out folders)"),
        (lambda d: d.update(variants=["baseline", "baseline"]), "['baseline'] listed more than once"),
        (lambda d: d.update(tokens=[4096, 8192, 4096]), "tokens must hold distinct values"),
        (lambda d: d.update(sizes=[16], tokens={16: [4096, 4096]}), "tokens for size 16 must hold distinct"),
        (lambda d: d.update(sizes=[], tokens=None, budgets={1e9: [16, 32, 16]}), "budgets[1e+09] must hold distinct values"),
        # two tuning budgets: tune.tokens was used and tune.tokens_per_param dropped without a word
        (lambda d: d["tune"].update(tokens_per_param=20.0),
         "tune.tokens (2048) and tune.tokens_per_param (20) both set the LR trials' token budget, and tune.tokens "
         "would be used: keep one"),
        # infinite or huge floats ended in OverflowError tracebacks where they became ints (run --dry-run too);
        # a depth of 10**21 hung the check that lists the valid r
        (lambda d: d["resources"].update(cpus=float("inf")), "resources.cpus: Input should be a finite number"),
        (lambda d: d["resources"].update(gpus=float("inf")), "resources.gpus: Input should be a finite number"),
        (lambda d: d["tune"].update(tokens=None, tokens_per_param=float("inf")), "tune.tokens_per_param: Input"),
        (lambda d: d["tune"].update(tokens=None, tokens_per_param=1e300),
         "tune.tokens_per_param: Input should be less than or equal to 1000000"),
        (lambda d: d["model"].update(effective_depth=10**21),
         "effective_depth must be at most 10,000 layers, got 1,000,000,000,000,000,000,000"),
        # a name YAML reads as another type said only "Input should be a valid string"
        (lambda d: d.update(name=123), "name: Input should be a valid string, got 123: YAML reads it as a number; "
                                       "write the text in quotes as you meant it, e.g. name: 'run-1'"),
        (lambda d: d.update(name=True), "YAML reads yes/no/on/off/true/false as a boolean; write the text in quotes"),
        (lambda d: d.update(name=__import__("datetime").date(2001, 12, 14)),
         "got 2001-12-14: YAML reads it as a date; write the text in quotes as you meant it"),
    ],
)
def test_bad_specs_name_the_key(mutate, key):
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(mutate))
    assert key in str(e.value)


def test_tune_tokens_with_the_default_tokens_per_param_parses_again_after_a_dump(tmp_path):
    """tune.tokens next to tokens_per_param other than its default is refused; model_dump() writes the default 10
    next to tokens, so a dumped spec (spec.yaml of a folder, design's candidates) must still parse, as must a spec
    that writes the default or null by hand, or tokens_per_param alone."""
    from loopscale.sweep.spec import spec_to_yaml

    spec = preset_spec("smoke")
    assert spec.tune.tokens == 2048 and spec.tune.tokens_per_param == 10.0
    dumped = spec.model_dump(mode="python")
    assert dumped["tune"]["tokens"] == 2048 and dumped["tune"]["tokens_per_param"] == 10.0
    assert parse_spec(dumped) == spec
    assert parse_spec({**dumped, "seeds": {r: 3 for r in spec.r}}).tune == spec.tune  # as `design` re-parses it
    (tmp_path / "spec.yaml").write_text(spec_to_yaml(spec))
    assert load_spec(tmp_path / "spec.yaml") == spec
    for tpp in (10, 10.0, None):
        assert parse_spec(_bad(lambda d, v=tpp: d["tune"].update(tokens_per_param=v))).tune.tokens == 2048
    alone = parse_spec(_bad(lambda d: d["tune"].update(tokens=None, tokens_per_param=20.0)))
    assert (alone.tune.tokens, alone.tune.tokens_per_param) == (None, 20.0)
    assert parse_spec(alone.model_dump(mode="python")) == alone


def test_a_seed_count_written_as_a_float_is_a_count():
    assert parse_spec({**_bad(lambda d: None), "seeds": 4.0}).seeds == [0, 1, 2, 3]


def test_r_not_dividing_depth_lists_valid_r():
    with pytest.raises(SpecError, match=r"valid r: \[1, 2, 4, 8\]"):
        parse_spec(_bad(lambda d: d.update(r=[1, 3])))


def test_a_spec_with_bad_keys_and_problems_across_keys_names_both_in_one_round():
    """A key that fails its own check (pydantic's) hid every check across keys until it was fixed: seeds: 0 and
    r: [1, 3] took two rounds. The checks that read none of the bad keys now run without them, in the same message;
    those that read one do not (a default in its place would make up a problem)."""
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(r=[1, 3], seeds=0, training={"optimizer": "foo"})))
    msg = str(e.value)
    assert msg.startswith("invalid sweep spec: seeds: seeds as a count must be in [1, ") and "training.optimizer" in msg
    assert msg.endswith("r=[3] must divide the looped depth (effective_depth - n_prelude - n_coda = 8); valid r: "
                        "[1, 2, 4, 8]") and msg.count("valid r") == 1  # fmt: skip
    # lr_data_exponent against an invalid training: not checked (it reads training.optimizer)
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(lr_data_exponent=0.3, training={"optimizer": "foo"})))
    assert "lr_data_exponent" not in str(e.value)
    # without a bad key of its own, a problem across keys is said as before
    with pytest.raises(SpecError, match=r"^invalid sweep spec: r=\[3\] must divide"):
        parse_spec(_bad(lambda d: d.update(r=[1, 3])))
    # a misspelt key stands for another, which would be read at its default: the checks reading that one are left
    # out too (rr: [1, 2] made up "seeds per r must give every r of the grid exactly: r = [1, 2, 4, 8]")
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(rr=d.pop("r") and [1, 2], seeds={1: [0], 2: [0, 1]}, ladder=[])))
    assert str(e.value) == "invalid sweep spec: rr: Extra inputs are not permitted (did you mean 'r'?)"
    # ... and it stands for the key its message suggests: a section's key put at the top (eval_token ->
    # training.eval_tokens) leaves tokens' own checks in (it left them out, as if tokens were misspelt)
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(eval_token=1, tokens={16: [4096], 64: [4096]})))
    assert str(e.value) == ("invalid sweep spec: eval_token: Extra inputs are not permitted (did you mean "
                            "'training.eval_tokens'?); tokens has sizes [64] not in sizes [16, 32]")
    # and a size whose model does not build (the model reads no training key) is said beside it too
    odd_batch = {**_bad(lambda d: None)["training"], "batch_tokens": 1000}
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(eval_token=1, r=[1, 3], sizes=[16, 30], training=odd_batch)))
    assert str(e.value).endswith("valid r: [1, 2, 4, 8]; sizes: size 30 at r=1 is invalid: d_model must be divisible "
                                 "by head_dim: d_model=30, head_dim=16 (try d_model=32)"), str(e.value)
    # the paper's model with its width scales given as sizes (read as d_model = 1, 2): the size unit is named
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(model={"preset": "paper"}, sizes=[6, 8], training=odd_batch)))
    assert str(e.value).endswith("sizes: size 6 at r=1 is invalid: d_model must be divisible by head_dim: d_model=6, "
                                 "head_dim=128 (try d_model=128); sizes are d_model values (model.size_unit: "
                                 "d_model); for the paper's width scales s (d_model = 64 s) set model.size_unit: "
                                 "width_scale"), str(e.value)  # fmt: skip
    # tokens invalid: the grid's own check (give one of tokens or budgets) is not made up from its absence
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(tokens="lots", r=[1, 3])))
    assert "exactly one of" not in str(e.value) and "valid r: [1, 2, 4, 8]" in str(e.value)
    # a run configuration every trial would refuse came in a later round still (it needs every key valid to build
    # every cell): one cell's (r = 1) is now checked beside the other keys' problems
    odd_batch = {**_bad(lambda d: None)["training"], "batch_tokens": 1000}
    for other in (dict(r=[1, 3]), dict(seeds=0), dict(rr=[1, 2])):
        with pytest.raises(SpecError) as e:
            parse_spec(_bad(lambda d, o=other: d.update(training=odd_batch, **o)))
        assert str(e.value).endswith(f"training: the run at size {_bad(lambda d: None)['sizes'][0]}, r=1, budget "
                                     f"{_bad(lambda d: None)['tokens'][0]:g} would fail in every trial: batch_tokens "
                                     "must be a positive multiple of model.seq_len=32, got 1000 (e.g. 992)"), str(e.value)
        assert str(e.value).count("batch_tokens") == 1
    # a size whose model does not build, and two budgets one model trains as one D: in the same round too
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(sizes=[16, 30], lr={"fixed": -0.01})))
    assert str(e.value) == ("invalid sweep spec: lr.fixed must be a positive number, got -0.01; sizes: size 30 at r=1 is "
                            "invalid: d_model must be divisible by head_dim: d_model=30, head_dim=16 (try d_model=32)")
    # a negative fixed LR reads no other key: said beside a bad r (its check was held back with lr.table's, which
    # reads r)
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(r=[1, 2, 0], lr={"fixed": -1})))
    assert str(e.value) == ("invalid sweep spec: r: r must hold distinct integers >= 1, got [1, 2, 0]; lr.fixed must "
                            "be a positive number, got -1")
    with pytest.raises(SpecError) as e:  # lr.table's entries are checked against the grid's r once r is valid
        parse_spec(_bad(lambda d: d.update(r=[1, 2, 0], lr={"table": {16: {1: 0.01, 5: 0.01}}})))
    assert str(e.value) == "invalid sweep spec: r: r must hold distinct integers >= 1, got [1, 2, 0]"
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(tokens=[2048, 2050], r=[1, 3, 4])))
    assert "valid r: [1, 2, 4, 8]; tokens: 2048 and 2050 both round to D = 2048 tokens" in str(e.value)
    # ... not with training itself invalid (the defaults in its place would make up a problem)
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(lambda d: d.update(r=[1, 3], training={**odd_batch, "optimizer": "foo"})))
    assert "would fail in every trial" not in str(e.value)


def test_gpus_where_none_exist_fail_before_ray():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    spec = parse_spec(_bad(lambda d: d.update(resources={"cpus": 1, "gpus": 0.5})))
    with pytest.raises(SpecError, match="resources.gpus"):
        spec.check_runtime(address=None)
    spec.check_runtime(address="10.0.0.1:6379")  # a cluster may have GPUs: not checked here


def test_a_model_too_large_for_this_machine_is_refused_before_ray(monkeypatch):
    """sizes: [16, 100000] passed `run --dry-run` (refused_here: None); the real run trained the d = 16 cells, every
    d = 100000 trial failed inside Ray for memory, and the command fitted half a grid and ended 0. The trainer's
    memory bound is now checked for every model of the grid (times its seed-ensemble members) before Ray starts;
    LR tuning, one model per trial, checks one model."""
    import loopscale.model.train as T
    from loopscale.model.accounting import n_total

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = parse_spec(_bad(lambda d: d.update(sizes=[16, 512], seeds=4)))
    one = T.TRAIN_STATE_BYTES_PER_PARAM * n_total(spec._model_config(512, 1, "baseline", 0))
    monkeypatch.setattr(T, "device_memory_bytes", lambda device: int(1.5 * one))  # one model fits, four do not
    with pytest.raises(SpecError, match=r"sizes: the model of size 512, r=1 does not fit in this machine's memory: 4 "
                                        r"seeds per trial of .* set resources.ensemble: 1 \(one seed per trial"):  # fmt: skip
        spec.check_runtime(data=False)
    spec.check_runtime(data=False, models="single")  # LR tuning trains one model per trial: it fits
    spec.check_runtime(data=False, models="none")  # a refit trains nothing
    single = parse_spec(_bad(lambda d: d.update(sizes=[16, 512], seeds=4, resources={"cpus": 1, "ensemble": 1})))
    single.check_runtime(data=False)  # one seed per trial: fits
    monkeypatch.setattr(T, "device_memory_bytes", lambda device: int(0.5 * one))
    with pytest.raises(SpecError, match=r"sizes: the model of size 512, r=1 does not fit.*: use smaller sizes, or pass "
                                        r"--address of a cluster$") as e:  # fmt: skip
        spec.check_runtime(data=False)
    assert "ensemble" not in str(e.value)  # one model does not fit either: no advice that cannot help
    single.check_runtime(address="10.0.0.1:6379", data=False)  # a cluster's nodes have their own memory
    small = parse_spec(_bad(lambda d: d.update(sizes=[16], seeds=4)))
    small.check_runtime(data=False)
    # a ladder rung deeper than the looped models is named by its depth
    deep = parse_spec(_bad(lambda d: d.update(sizes=[512], ladder=[40])))
    rung = T.TRAIN_STATE_BYTES_PER_PARAM * n_total(deep._model_config(512, 1, "baseline", 0, depth=40))
    monkeypatch.setattr(T, "device_memory_bytes", lambda device: int(rung * 0.9))
    with pytest.raises(SpecError, match=r"the model of size 512, r=1, ladder depth 40 does not fit"):
        deep.check_runtime(data=False)
    # a model made large by its hyperconnection lanes is told to lower K, not its width (a d = 16 model of 20
    # billion parameters was told "use smaller sizes")
    monkeypatch.undo()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    lanes = parse_spec(_bad(lambda d: d.update(sizes=[16], variants=[{"name": "hyperconnect", "hc_lanes": 100_000}])))
    with pytest.raises(SpecError, match=r"the model of size 16, r=2, variant hyperconnect does not fit.*: 20,000,400,000 "
                                        r"of its parameters are the hyperconnection weights of hc_lanes=100000 \(r "
                                        r"\(K\^2 \+ 2K\)\): use fewer lanes \(the paper uses 2\), or pass --address"):  # fmt: skip
        lanes.check_runtime(data=False)


def test_trial_larger_than_the_embedded_ray_fails_before_ray(monkeypatch, tmp_path):
    """A trial asking for more CPUs than the embedded Ray has would wait forever in Tune's queue (seen: 64 CPUs on
    a 2-core machine, 'No trial is running' every minute): refused before Ray starts, by the CLI with exit 2."""
    import os

    import yaml
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cores = os.cpu_count() or 1
    big = parse_spec(_bad(lambda d: d.update(resources={"cpus": cores + 1})))
    with pytest.raises(SpecError, match=rf"resources.cpus={cores + 1} per trial, but the embedded Ray has {cores} CPUs"):
        big.check_runtime()
    ok = parse_spec(_bad(lambda d: d.update(resources={"cpus": 2})))
    ok.check_runtime(num_cpus=2)
    with pytest.raises(SpecError, match="embedded Ray has 1 CPUs \\(--num-cpus\\)"):
        ok.check_runtime(num_cpus=1)
    big.check_runtime(address="10.0.0.1:6379")  # a cluster may grow (autoscaler): not checked
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    big.check_runtime()  # joining the cluster of RAY_ADDRESS: not checked either
    monkeypatch.delenv("RAY_ADDRESS")
    spec_file = tmp_path / "big.yaml"
    spec_file.write_text(yaml.safe_dump(big.model_dump(mode="json")))
    for cmd in (["sweep"], ["tune-lr"], ["run"]):
        res = CliRunner().invoke(app, [*cmd, str(spec_file), "--out", str(tmp_path / "o")])
        assert res.exit_code == 2 and "no trial could start" in res.output, (cmd, res.output)
    assert not (tmp_path / "o").exists()


def test_load_spec_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_spec(tmp_path / "nope.yaml")
    p = tmp_path / "x.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(p)


def test_spec_is_frozen_and_typed():
    s = preset_spec("smoke")
    assert isinstance(s, SweepSpec)
    import pydantic

    with pytest.raises(pydantic.ValidationError):
        s.name = "x"


def test_bad_budgets_name_the_values_without_placeholders():
    d = copy.deepcopy(PRESETS["smoke"])
    d["tokens"] = [-2048, 4096]
    with pytest.raises(ValueError, match=r"tokens must all be > 0, got \[-2048, 4096\]") as e:
        parse_spec(d)
    assert "<spec>" not in str(e.value) and "for size" not in str(e.value)
    d["tokens"] = {16: [2048], 32: [0]}
    with pytest.raises(ValueError, match=r"got \[0\] for size 32"):
        parse_spec(d)


@pytest.mark.parametrize(
    "patch,key,hint",
    [
        ({"trainig": {"batch_tokens": 256}}, "trainig", "'training'"),
        ({"training": {"batch_tokns": 256}}, "training.batch_tokns", "'batch_tokens'"),
        ({"tune": {"lr_mni": 1e-3}}, "tune.lr_mni", "'lr_min'"),
        ({"variants": [{"name": "hyperconnect", "hc_lane": 4}]}, "variants.0.hc_lane", "'hc_lanes'"),
        ({"zzzz": 1}, "zzzz", None),
        ({"lr": {"fixd": 0.01}}, "", "'fixed'"),
    ],
)
def test_unknown_key_names_the_closest_known_one(patch, key, hint):
    """A misspelt key is refused with the key the spec accepts there that it is closest to (none when none is)."""
    d = copy.deepcopy(PRESETS["smoke"])
    for k, v in patch.items():
        d[k] = {**d[k], **v} if k in ("training", "tune") and isinstance(d.get(k), dict) else v
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    msg = str(e.value)
    assert f"{key}: Extra inputs are not permitted" in msg if key else "lr must be 'tune'" in msg
    assert (f"(did you mean {hint}?)" in msg) if hint else "did you mean" not in msg


def test_a_cell_hashes_its_run_definition_once(monkeypatch):
    """cells() and the grid read run_id several times per cell; it is hashed once (20,000 seeds x 16 cells took 59 s
    to build with two hashes per cell, 34 s with one)."""
    import loopscale.sweep.spec as S

    cell = preset_spec("smoke").cells()[0]
    calls = []
    real = S.run_id
    monkeypatch.setattr(S, "run_id", lambda c: calls.append(1) or real(c))
    fresh = S.Cell(cell.variant, cell.r, cell.size, cell.budget, cell.seed, cell.run)
    assert fresh.run_id == fresh.run_id == real(cell) and len(calls) == 1


def test_relative_corpus_is_taken_from_the_working_directory(tmp_path, monkeypatch):
    """Tune runs every trial in its own folder: a relative corpus passed the driver's pre-flight and then every
    trial failed with 'corpus file ... does not exist'. The spec makes it absolute, as it does storage_path."""
    monkeypatch.chdir(tmp_path)
    base = {"r": [1, 2], "sizes": [16], "tokens": [4096], "lr": {"fixed": 0.01}}
    spec = parse_spec({**base, "corpus": "data/train.txt"})
    assert spec.corpus == str(tmp_path / "data" / "train.txt")
    assert {c.run.corpus for c in spec.cells()} == {spec.corpus}
    assert parse_spec({**base, "corpus": "./shards/*.parquet"}).corpus == str(tmp_path / "shards" / "*.parquet")
    for kept in ("embedded", "/abs/corpus.txt", "~/corpus.txt"):
        assert parse_spec({**base, "corpus": kept}).corpus == kept
    # read back from the folder's spec.yaml in the same directory: the same spec (and run ids)
    assert parse_spec(spec.model_dump(mode="python")) == spec


def test_a_folder_spec_with_a_relative_corpus_is_read_against_the_working_directory(tmp_path, monkeypatch):
    """A folder's spec.yaml written with a relative corpus (before the spec made it absolute) is read as this version
    reads a spec, against the working directory: from the same one it is the same spec (and rewritten absolute);
    a spec whose corpus is elsewhere is refused naming the corpus. Before, it was refused either way, naming no
    key."""
    import yaml

    from loopscale.sweep.spec import FOLDER_SPEC, check_folder_spec, record_folder_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text("Plain prose for a tiny corpus. " * 200)
    raw = {"r": [1, 2], "sizes": [16], "tokens": [4096], "lr": {"fixed": 0.01}, "corpus": "data/train.txt"}
    out = tmp_path / "out"
    out.mkdir()
    (out / FOLDER_SPEC).write_text(yaml.safe_dump(raw, sort_keys=False))
    spec = parse_spec(raw)
    record_folder_spec(out, spec)
    assert yaml.safe_load((out / FOLDER_SPEC).read_text())["corpus"] == str(tmp_path / "data" / "train.txt")
    (out / FOLDER_SPEC).write_text(yaml.safe_dump(raw, sort_keys=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ValueError, match=r"it differs in corpus: '.*/elsewhere/data/train.txt' -> '.*/data/train"):
        check_folder_spec(out, spec)


def test_r_and_sizes_in_another_order_are_the_same_spec_of_a_folder(tmp_path):
    """A finished folder of r: [1, 2, 4] refused the same spec written r: [4, 1, 2] ("holds a run of a different
    spec ... it differs in r"): the grid is the same. Another r is still refused."""
    from loopscale.sweep.spec import check_folder_spec, record_folder_spec

    raw = {"r": [1, 2, 4], "sizes": [16, 32], "tokens": [4096], "lr": {"fixed": 0.01}}
    out = tmp_path / "out"
    out.mkdir()
    record_folder_spec(out, parse_spec(raw))
    given = tmp_path / "given.yaml"  # a spec.yaml written by hand in the other order: the same spec
    given.write_text("r: [4, 1, 2]\nsizes: [32, 16]\ntokens: [4096]\nlr: {fixed: 0.01}\n")
    from loopscale.sweep.spec import FOLDER_SPEC, load_spec

    before = (out / FOLDER_SPEC).read_text()
    again = load_spec(given)
    assert again.r == [1, 2, 4] and again.sizes == [16, 32]
    check_folder_spec(out, again, corpus=False)
    record_folder_spec(out, again)
    assert (out / FOLDER_SPEC).read_text() == before  # not rewritten for the order
    assert not [p.name for p in out.iterdir() if p.name.startswith(FOLDER_SPEC + ".")]  # no "given" copy put aside
    with pytest.raises(ValueError, match=r"it differs in r: \[1, 2, 4\] -> \[1, 2\]"):
        check_folder_spec(out, parse_spec({**raw, "r": [1, 2]}), corpus=False)


def test_a_spec_written_otherwise_is_the_same_spec_of_a_folder(tmp_path):
    """A folder's spec was refused as another spec when the spec given wrote out a value the folder's leaves to its
    default (model.effective_depth 10 on the cpu preset), or gave tokens, seeds or an LR table row per size or per r
    with one value for all: the runs are the same (equal run ids). A real change is still refused, and only it is
    named."""
    from loopscale.sweep.spec import FOLDER_SPEC, canonical_spec, check_folder_spec, record_folder_spec

    raw = {"r": [1, 2, 4], "sizes": [16, 32], "tokens": [4096, 8192], "seeds": 2,
           "lr": {"table": {16: 0.01, 32: {1: 0.02, 2: 0.03, 4: 0.03}}}}  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    first = parse_spec(raw)
    record_folder_spec(out, first, corpus=False)
    same = [
        {**raw, "model": {"effective_depth": 10, "n_prelude": 1, "n_coda": 1, "seq_len": 128, "head_dim": 16}},
        {**raw, "tokens": {16: [4096, 8192], "32": [4096, 8192]}},
        {**raw, "seeds": {1: [0, 1], 2: 2, 4: [0, 1]}},
        {**raw, "lr": {"table": {16: {1: 0.01, 2: 0.01, 4: 0.01}, 32: {1: 0.02, 2: 0.03, 4: 0.03}}}},
        {**raw, "lr": {"table": {16.0: 0.01, "32": {1: 0.02, 2: 0.03, 4: 0.03}}}},  # keys as lr_for reads them
    ]
    ids = [c.run_id for c in first.cells()]
    for d in same:
        spec = parse_spec(d)
        assert [c.run_id for c in spec.cells()] == ids, d
        assert canonical_spec(spec) == canonical_spec(first), d
        check_folder_spec(out, spec, corpus=False)
    with pytest.warns(UserWarning, match="is rewritten as loopscale records a spec"):
        record_folder_spec(out, parse_spec(same[0]), corpus=False)
    assert [p.name for p in out.iterdir() if p.name.startswith(FOLDER_SPEC + ".given")]
    # a real difference: refused, naming it alone (not the depth written out beside it)
    other = {**same[0], "seeds": {1: [0, 1], 2: [0, 1, 2], 4: [0, 1]}}
    with pytest.raises(ValueError, match=r"it differs in seeds: \[0, 1\] -> \{'1': \[0, 1\], '2': \[0, 1, 2\], '4': \[0, 1\]\}\)"):
        check_folder_spec(out, parse_spec(other), corpus=False)
    # a table built in Python may hold 16 and "16" (YAML refuses the repeat): the LR the cells train at decides
    two = parse_spec({**raw, "lr": {"table": {16: 0.02, "16": 0.01, 32: {1: 0.02, 2: 0.03, 4: 0.03}}}})
    assert two.lr_for(16, 1) == 0.02 and canonical_spec(two) != canonical_spec(first)
    for d, key in (({**raw, "model": {"effective_depth": 6}}, "model.effective_depth: 10 -> 6"),
                   ({**raw, "tokens": {16: [4096, 8192], 32: [4096, 16384]}}, "tokens: [4096, 8192] -> "),
                   ({**raw, "lr": {"table": {16: {1: 0.01, 2: 0.01, 4: 0.02}, 32: 0.02}}}, "lr.table.16: 0.01 -> ")):  # fmt: skip
        with pytest.raises(ValueError, match="it differs in " + re.escape(key)):
            check_folder_spec(out, parse_spec(d), corpus=False)


def test_a_folder_without_its_spec_yaml_takes_only_a_spec_whose_cells_its_runs_are(tmp_path):
    """A folder whose spec.yaml was deleted took another spec, and `run` then fitted the runs of both grids as one
    (the report counted 22 runs, status 12 planned). Without spec.yaml the recorded runs must all be cells of the
    spec given: another spec is refused naming the runs, before anything runs; the same spec still passes, with
    the spec.yaml deleted or torn (0 bytes) by a crash."""
    import subprocess
    import sys

    from loopscale.sweep.spec import FOLDER_SPEC, check_folder_spec, record_folder_spec, spec_to_yaml
    from loopscale.sweep.store import ResultsStore, failed_record, run_record

    smoke = preset_spec("smoke")
    out = tmp_path / "o2"
    out.mkdir()
    store = ResultsStore(out)
    for c in smoke.cells()[:-1]:
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    store.write_run(failed_record(smoke.cells()[-1], "RuntimeError: out of memory"))
    store.consolidate()
    other = smoke.model_copy(update={"name": "other", "sizes": [16, 48], "r": [1, 2, 4]})
    with pytest.raises(ValueError, match=r"has no readable spec.yaml and 10 of its 16 recorded runs are not cells of "
                                         r"this spec \([0-9a-f]{16} \(r \d, size 32, \d+ tokens, seed 0\), .* and 7 "
                                         r"more\)"):  # fmt: skip
        check_folder_spec(out, other)
    assert not (out / FOLDER_SPEC).exists()
    record_folder_spec(out, smoke)  # the same spec: its runs are all cells of it
    (out / FOLDER_SPEC).write_text("")  # torn by a crash
    with pytest.warns(UserWarning, match="0 bytes"):
        record_folder_spec(out, smoke)
    assert (out / FOLDER_SPEC).read_text() == spec_to_yaml(smoke)
    # cut short (a partial copy) or not YAML: "holds a run of a different spec", naming no difference, even for the
    # spec that made the folder; it is torn too: the runs decide, and the file is kept aside and rewritten
    for torn in (spec_to_yaml(smoke)[:60], "name: [unclosed"):
        (out / FOLDER_SPEC).write_text(torn)
        with pytest.raises(ValueError, match="has no readable spec.yaml and 10 of its 16"):
            check_folder_spec(out, other)
        assert (out / FOLDER_SPEC).read_text() == torn  # refused: nothing changed
        with pytest.warns(UserWarning, match="not a spec this loopscale reads"):
            record_folder_spec(out, smoke)
        assert (out / FOLDER_SPEC).read_text() == spec_to_yaml(smoke)
        assert [p.read_text() for p in out.glob(f"{FOLDER_SPEC}.unreadable-*") if p.read_text() == torn] == [torn]
    # `loopscale run` refuses before any compute (exit 2) and changes nothing
    (out / FOLDER_SPEC).unlink()
    (tmp_path / "other.yaml").write_text(spec_to_yaml(other))
    before = (out / "runs.parquet").read_bytes()
    p = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", str(tmp_path / "other.yaml"), "--out",
                        str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 2 and "recorded runs are not cells of this spec" in p.stderr, p.stderr[-2000:]
    assert (out / "runs.parquet").read_bytes() == before and not (out / FOLDER_SPEC).exists()


def test_a_budget_too_small_for_one_step_names_the_model_and_the_c_every_model_needs():
    """A FLOP budget that buys less than one optimizer step was an error without the spec prefix, naming neither the
    size nor r, and its "use C >= X" was the need of whichever model failed first (r = 1): a budget of X was then
    refused for r = 2. Now it is refused when the spec is read, with the C that every model at the budget can use."""
    base = {"name": "b", "r": [1, 2, 4, 8], "budgets": {1e9: [16, 32]}}
    with pytest.raises(SpecError) as e:
        parse_spec(base)
    msg = str(e.value)
    assert "budgets[1e+09]: size 32 at r = 1 gets 0.381 optimizer steps of 2048 tokens" in msg
    need = float(msg.split("needs C >= ")[1].split()[0])
    parse_spec({**base, "budgets": {need: [16, 32]}})  # enough for every model there
    with pytest.raises(SpecError, match=r"size 32 at r = 8 gets 0\.4"):
        parse_spec({**base, "budgets": {0.98 * need: [16, 32]}})



BASE = {
    "name": "x",
    "model": {"preset": "cpu", "seq_len": 32},
    "r": [1, 2, 4, 8],
    "training": {"batch_tokens": 256, "eval_tokens": 2048},
    "lr": {"fixed": 0.01},
}
"""A small spec of laptop runs (batch of 256 tokens) without a grid: each test adds sizes and tokens, or budgets."""


def test_token_budgets_that_round_to_one_d_are_refused_naming_both_values_d_and_the_batch():
    """The trainer rounds tokens to whole batches (D = max(1, round(tokens / B)) B): 300 and 350 at B = 256 both train
    D = 256 tokens. They were two runs (two run ids) of one training, fitted as two points; now the spec is refused,
    naming both values, the D and training.batch_tokens, for a list, a per-size mapping and FLOP budgets."""
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, "sizes": [16, 32], "tokens": [300, 350, 2048]})
    assert (
        "tokens: 300 and 350 both round to D = 256 tokens (whole batches of training.batch_tokens = 256" in str(e.value)
    )
    # Python rounds halves to even: 384 and 640 tokens are 1.5 and 2.5 batches, both 2 batches
    with pytest.raises(SpecError, match=r"tokens: 384 and 640 both round to D = 512 tokens"):
        parse_spec({**BASE, "sizes": [16], "tokens": [384, 640]})
    with pytest.raises(SpecError, match=r"tokens for size 32: 300 and 350 both round to D = 256 tokens"):
        parse_spec({**BASE, "sizes": [16, 32], "tokens": {16: [2048, 4096], 32: [350, 2048, 300]}})
    # two FLOP budgets of one model: round(C / (F B)) B; 1e9 and 1.01e9 are 14.3 and 14.5 steps of size 16 at r = 1
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, "budgets": {1e9: [16, 32], 1.01e9: [16, 32]}})
    assert "budgets: 1e+09 and 1.01e+09 FLOPs both give size 16 at r = 1 the same D = 3584 tokens" in str(e.value)
    assert "training.batch_tokens = 256" in str(e.value)
    # each variant's model has its own FLOPs per token: these two budgets are distinct for the baseline models
    # (8 and 9 steps at r = 1, 7 and 8 at r = 8) and both 10 steps of truncated BPTT at r = 8
    budgets = {**BASE, "r": [1, 8], "budgets": {5.65e8: [16], 5.95e8: [16]}}
    assert len(parse_spec(budgets).cells()) == 4
    with pytest.raises(SpecError, match=r"both give size 16 at r = 8, variant trunc_bptt the same D = 2560 tokens"):
        parse_spec({**budgets, "variants": ["baseline", "trunc_bptt"]})
    # values a batch apart, and budgets of different sizes, stay a grid
    assert {c.run.tokens for c in parse_spec({**BASE, "sizes": [16], "tokens": [300, 2048]}).cells()} == {300, 2048}
    parse_spec({**BASE, "budgets": {1e9: [32], 1.01e9: [16]}})


BASE_YAML = """\
name: x
model: {preset: cpu, seq_len: 32}
r: [1, 2, 4, 8]
training: {batch_tokens: 256, eval_tokens: 2048}
lr: {fixed: 0.01}
"""
"""BASE as the YAML a user writes."""


def _refused_by_the_cli(tmp_path, text: str) -> str:
    """Write ``text`` as a spec and run ``loopscale run`` on it with and without --dry-run: both must exit 2 with
    one ``error:`` line and write nothing. Returns the error line."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    out = tmp_path / "out"
    lines = []
    for flags in (["--dry-run"], []):
        res = CliRunner().invoke(app, ["run", str(spec), "--out", str(out), *flags])
        assert res.exit_code == 2, res.output
        assert res.output.startswith("error: ") and res.output.count("\n") == 1, res.output
        assert not out.exists()
        lines.append(res.output)
    assert lines[0] == lines[1]
    return lines[0]


def test_a_key_given_twice_in_the_yaml_is_refused_naming_it_and_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys without a word: ``lr:`` twice trained at the second LR, ``sizes:``
    twice dropped the first list. Now the spec is refused naming the key (dotted, at any depth) and both lines."""
    msg = _refused_by_the_cli(tmp_path, BASE_YAML + "sizes: [16, 32]\ntokens: [2048]\nlr: {fixed: 0.02}\n")
    assert "key 'lr' is given twice, on lines 5 and 8" in msg
    p = tmp_path / "s.yaml"
    p.write_text(BASE_YAML + "sizes: [16, 32]\ntokens: [2048, 4096]\nsizes: [16]\n")
    with pytest.raises(SpecError, match=r"key 'sizes' is given twice, on lines 6 and 8; YAML would keep only the last"):
        load_spec(p)
    nested = BASE_YAML.replace("training: {batch_tokens: 256, eval_tokens: 2048}", "training:\n  batch_tokens: 256\n"
                               "  eval_tokens: 2048\n  batch_tokens: 512")
    p.write_text(nested + "sizes: [16, 32]\ntokens: [2048]\n")
    with pytest.raises(SpecError, match=r"key 'training.batch_tokens' is given twice, on lines 5 and 7"):
        load_spec(p)
    p.write_text(BASE_YAML + "sizes: [16, 32]\ntokens: [2048]\nvariants:\n- baseline\n- {name: hyperconnect, "
                 "hc_lanes: 2, hc_lanes: 4}\n")
    with pytest.raises(SpecError, match=r"key 'variants.1.hc_lanes' is given twice, both on line 10"):
        load_spec(p)
    # two spellings of one number are one key
    p.write_text(BASE_YAML + "budgets: {1e9: [16], 1.0e9: [32]}\n")
    with pytest.raises(SpecError, match=r"key 'budgets.1.0e9' is given twice \(as '1e9' and '1.0e9'\), both on line 6"):
        load_spec(p)
    # a number and the same number quoted are one size too (the spec reads both as 16): the quoted one was merged
    p.write_text(BASE_YAML + "sizes: [16, 32]\ntokens: {16: [2048], '16': [4096], 32: [2048]}\n")
    with pytest.raises(SpecError, match=r"key 'tokens.16' is given twice, both on line 7"):
        load_spec(p)
    # a key a merge brings in may be overridden (YAML's intent), and distinct keys stay a spec
    p.write_text(BASE_YAML + "sizes: [16, 32]\ntokens: [2048]\n"
                 "tune: {<<: {num_samples: 3, seed: 1}, seed: 2}\n")
    assert load_spec(p).tune.seed == 2 and load_spec(p).tune.num_samples == 3


def test_a_size_the_per_size_tokens_leave_out_is_refused_naming_it():
    """``sizes: [16, 32]`` with ``tokens: {16: [...]}`` trained size 16 only, without a word; now the spec is
    refused naming the size(s) the mapping leaves out (a size in tokens but not in sizes already was)."""
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, "sizes": [16, 32], "tokens": {16: [2048, 4096]}})
    assert "tokens gives no token budgets for size 32 of sizes [16, 32]: add it to tokens" in str(e.value)
    with pytest.raises(SpecError, match=r"no token budgets for sizes 16, 64 of sizes \[16, 32, 64\]: add them"):
        parse_spec({**BASE, "sizes": [16, 32, 64], "tokens": {32: [2048, 4096]}})
    spec = parse_spec({**BASE, "sizes": [16, 32], "tokens": {16: [2048, 4096], 32: [2048]}})
    assert sorted({(c.size, c.run.tokens) for c in spec.cells()}) == [(16, 2048), (16, 4096), (32, 2048)]


def test_sizes_next_to_budgets_are_refused_as_unused():
    """``sizes`` was ignored when ``budgets`` was given: ``sizes: [64, 128]`` next to ``budgets: {1e9: [16, 32], ...}``
    trained 16 and 32 only. The grid, the LR tuning and lr.table all take the budgets' sizes, so sizes is refused."""
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, "sizes": [64, 128], "budgets": {1e9: [16, 32], 2e9: [16, 32]}})
    assert "sizes [64, 128] is not used with budgets: each budget lists its own sizes" in str(e.value)
    spec = parse_spec({**BASE, "budgets": {1e9: [16, 32], 2e9: [16, 32]}})
    assert spec.all_sizes() == [16, 32] and {c.size for c in spec.cells()} == {16, 32}


def test_too_many_prelude_and_coda_layers_are_refused_naming_the_model_keys():
    """``model: {n_prelude: 6, n_coda: 6}`` at the cpu preset's depth 10 was refused as "sizes: size 16 at r=1 is
    invalid" (r = [1]) or "r=[2] must divide the looped depth (... = -2)" (r = [1, 2]), naming keys the user had
    right. Now the model keys are named, with the preset's value where one is not given."""
    model = {"preset": "cpu", "seq_len": 32, "n_prelude": 6, "n_coda": 6}
    for r in ([1], [1, 2]):
        with pytest.raises(SpecError) as e:
            parse_spec({**BASE, "model": model, "r": r, "sizes": [16], "tokens": [2048]})
        msg = str(e.value)
        assert (
            "model.n_prelude + model.n_coda = 6 + 6 = 12 must be less than model.effective_depth = 10 (the cpu "
            "preset's): the looped block needs at least one layer" in msg
        ), msg
        assert "sizes:" not in msg and "r=" not in msg
    with pytest.raises(SpecError, match=r"= 1 \(the cpu preset's\) \+ 1 \(the cpu preset's\) = 2 must be less than "
                                        r"model.effective_depth = 2:"):
        parse_spec({**BASE, "model": {"preset": "cpu", "effective_depth": 2}, "r": [1], "sizes": [16], "tokens": [2048]})
    # a negative count, or a depth of 0 (read as "the preset's" before), names its key
    for key, value, least in (("n_prelude", -1, 0), ("n_coda", -1, 0), ("effective_depth", 0, 1)):
        with pytest.raises(SpecError, match=rf"model.{key}: Input should be greater than or equal to {least}"):
            parse_spec({**BASE, "model": {"preset": "cpu", key: value}, "sizes": [16], "tokens": [2048]})
    spec = parse_spec({**BASE, "model": {**model, "n_prelude": 4, "n_coda": 4}, "r": [1, 2], "sizes": [16],
                       "tokens": [2048]})
    assert {c.run.model.n_recur_block for c in spec.cells() if c.r == 2} == {1}


@pytest.mark.parametrize(
    "patch, message",
    [
        # a bare number was "lr.literal['tune']: Input should be 'tune'; lr.dict[str,any]: ..."
        ({"lr": 0.01}, "lr: must be 'tune', {fixed: LR} or {table: ...}, got 0.01: for a fixed LR write "
                       "lr: {fixed: 0.01}"),
        ({"lr": "1e-2"}, "lr: must be 'tune', {fixed: LR} or {table: ...}, got '1e-2' (quoted, so YAML reads it as "
                         "text): for a fixed LR write lr: {fixed: 0.01}"),
        ({"lr": "tuen"}, "lr: must be 'tune', {fixed: LR} or {table: ...}, got 'tuen'"),
        # "tokens.list[int].0: ... unable to parse string as an integer; tokens.dict[int,list[int]]: ..."
        ({"tokens": ["1e5"]}, "tokens: must be a list of integers (D in tokens, e.g. [100000, 200000]) or a per-size "
                              "mapping {size: [D, ...]}; tokens.0: Input should be a valid integer, unable to parse "
                              "string as an integer ('1e5' is quoted, so YAML reads it as text: write 100000 without "
                              "quotes)"),
        ({"tokens": "1e5"}, "tokens: must be a list of integers (D in tokens, e.g. [100000, 200000]) or a per-size "
                            "mapping {size: [D, ...]}, got '1e5' (quoted, so YAML reads it as text): for one budget "
                            "write tokens: [100000]"),
        ({"tokens": 1e5}, "got 100000.0: for one budget write tokens: [100000]"),
        ({"tokens": {16: ["1e5"]}}, "mapping {size: [D, ...]}; tokens.16.0: Input should be a valid integer, unable "
                                    "to parse string as an integer ('1e5' is quoted, so YAML reads it as text: write "
                                    "100000 without quotes)"),
        ({"seeds": {1: [0.5], 2: 1, 4: 1, 8: 1}}, "seeds: must be a count, a list of integer seeds, or a mapping r -> "
                                                  "either; seeds.1.0: Input should be a valid integer, got a number "
                                                  "with a fractional part"),
        # a value without the brackets or braces of its key's shape: the value given and the same value in that shape
        ({"r": 4}, "invalid sweep spec: r: must be a list, got 4; a list is written in brackets: r: [4] for one value"),
        ({"sizes": "16"}, "sizes: must be a list, got '16'; a list is written in brackets: sizes: [16] for one value"),
        ({"r": {1: 2}}, "r: must be a list, got {1: 2} (a mapping); a list is written in brackets, e.g. r: [1, 2]"),
        ({"model": "cpu"}, "model: must be a mapping, got 'cpu'; the model family is a key of model: write "
                           "model: {preset: cpu}"),
        ({"training": 3}, "training: must be a mapping, got 3; a mapping is written in braces: training: "
                          "{key: value, ...}"),
        ({"tune": None}, "tune: must be a mapping, got None (the key with no value); a mapping is written in "
                         "braces: tune: {key: value, ...}, or leave the key out for its defaults"),
        ({"model": {"seq_len": [32]}}, "model.seq_len: Input should be a valid integer, got [32] (a list): write "
                                       "seq_len: 32"),
        ({"seeds": "2"}, "got '2' (quoted, so YAML reads it as text: write 2 without quotes)"),
        ({"seeds": {1: "3", 2: 1, 4: 1, 8: 1}}, "seeds[1] must be a count (an integer >= 1, e.g. 4 for [0, 1, 2, 3]) "
                                                "or a list of integer seeds; got '3' (quoted, so YAML reads it as "
                                                "text: write 3 without quotes)"),
        # the same rule for every key: a quoted number says what to write
        ({"training": {"batch_tokens": "2.56e2"}}, "training.batch_tokens: Input should be a valid integer, unable to "
                                                   "parse string as an integer ('2.56e2' is quoted, so YAML reads it "
                                                   "as text: write 256 without quotes)"),
    ],
)
def test_a_value_of_the_wrong_form_is_refused_in_the_specs_words(patch, message):
    """A value of the wrong form for a key that takes several (lr, tokens, seeds) was one pydantic error per form,
    named by its Python type (``lr.literal['tune']``, ``tokens.dict[int,list[int]]``); now it is one message saying
    what the key takes and, for a number written as text or without its list, what to write."""
    d = {**BASE, "sizes": [16, 32], "tokens": [2048], **patch}
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    msg = str(e.value)
    assert message in msg, msg
    assert "literal[" not in msg and "list[int]" not in msg and "dict[" not in msg, msg


def test_hc_lanes_on_a_variant_without_lanes_is_refused_naming_the_variant():
    """``hc_lanes`` only reaches the model of the hyperconnect variant (model.injection cannot be hyperconnect):
    ``{name: baseline, hc_lanes: 4}`` or ``{name: trunc_bptt, hc_lanes: 4}`` was accepted and changed nothing.
    The default 2, which a dumped spec writes for every variant, is let through."""
    for name in ("baseline", "trunc_bptt"):
        with pytest.raises(SpecError) as e:
            parse_spec({**BASE, "sizes": [16, 32], "tokens": [2048], "variants": [{"name": name, "hc_lanes": 4}]})
        assert f"variants.0: hc_lanes (4) has no effect on variant {name!r}: only hyperconnect has lanes" in str(e.value)
    spec = parse_spec({**BASE, "sizes": [16], "tokens": [2048], "variants": [
        {"name": "baseline", "hc_lanes": 2}, "trunc_bptt", {"name": "hyperconnect", "hc_lanes": 4}]})
    assert {c.run.model.hc_lanes for c in spec.cells() if c.variant == "hyperconnect"} == {4}
    assert parse_spec(spec.model_dump(mode="python")) == spec  # every variant dumped with hc_lanes


def test_the_readme_key_list_names_every_spec_and_model_key_and_hc_lanes():
    """README's "Spec keys:" paragraph lacked ``model.injection``, the variant key ``hc_lanes`` (and ``name``,
    ``text_column``, ``data_seed``, ``model.vocab_size``, ``model.size_unit``): every key of the spec's top level,
    of ``model`` and of a variant is named there, in backticks, and the choices it names are the code's."""
    import typing

    from loopscale.sweep.spec import ModelSpec, VariantSpec

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("Spec keys:\n\n")  # a table follows; a pipe inside its cells is written \|
    para = text[start : text.index("\n\n", start + len("Spec keys:\n\n"))].replace("\\|", "|")
    for cls in (SweepSpec, ModelSpec, VariantSpec):
        missing = [k for k in cls.model_fields if f"`{k}" not in para]
        assert not missing, f"README's spec keys lack {cls.__name__}'s {missing}"
    for key in ("preset", "size_unit", "injection"):
        choices = "|".join(typing.get_args(ModelSpec.model_fields[key].annotation))
        assert f"`{key}: {choices}`" in para, key
    variants = typing.get_args(VariantSpec.model_fields["name"].annotation)
    assert all(f"`{v}`" in para for v in variants)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "the sweep spec is empty: it needs at least tokens (with sizes) or budgets"),
        ("# only a comment\n", "the sweep spec is empty"),
        ("- 1\n- 2\n", "a sweep spec must be a mapping of keys (name:, r:, sizes:, ...), got a list"),
        ("smoke\n", "got a single string"),
    ],
)
def test_an_empty_or_non_mapping_spec_file_says_what_it_is(tmp_path, text, message):
    """An empty spec file said 'a sweep spec must be a mapping, got NoneType' (a Python type name)."""
    from loopscale.sweep.spec import load_spec

    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert message in str(e.value) and "NoneType" not in str(e.value)


def test_model_copy_with_an_update_is_validated_as_a_spec():
    """spec.model_copy(update={"r": "banana"}) passed (pydantic skips validation there) and failed later inside
    cells() with "'>' not supported between instances of 'str' and 'int'"; r=[1, 3] failed with a bare ValueError
    naming no key. An update is now validated as a spec read from YAML, naming the key; a valid one gives the
    spec of its YAML."""
    from loopscale.sweep.presets import preset_spec
    from loopscale.sweep.spec import SpecError

    spec = preset_spec("smoke")
    with pytest.raises(SpecError, match=r"^invalid sweep spec: r"):
        spec.model_copy(update={"r": "banana"})
    with pytest.raises(SpecError, match=r"r=\[3\]"):
        spec.model_copy(update={"r": [1, 3]})
    with pytest.raises(SpecError, match=r"unknown spec key\(s\) \['rr'\]"):
        spec.model_copy(update={"rr": [1, 2]})
    two = spec.model_copy(update={"r": [1, 2]})
    assert two.r == [1, 2] and len(two.cells()) == len(spec.cells()) // 2
    assert two == parse_spec({**spec.model_dump(), "r": [1, 2]}) and spec.model_copy() == spec


@pytest.mark.parametrize(
    "section,key,value",
    [
        ("resources", "ensemble", True),
        ("", "r", [True, 2, 4, 8]),
        ("", "seeds", [True]),
        ("", "ladder", [True, 2]),
        ("", "max_failures", True),
        ("", "data_seed", False),
        ("tune", "num_samples", True),
        ("tune", "lr_min", True),
        ("model", "n_prelude", True),
        ("training", "batch_tokens", True),
        ("", "tokens", {16: [2048, True], 32: [2048]}),
    ],
)
def test_a_yaml_boolean_in_a_number_key_is_refused_not_read_as_one_or_zero(section, key, value):
    """pydantic's lax mode read YAML true / false as 1 / 0 in number keys: ``resources: {ensemble: true}`` trained
    every seed as its own trial (ensemble = 1), ``r: [true, 2, 4, 8]`` trained r = 1."""
    d = copy.deepcopy(PRESETS["smoke"])
    if section:
        d[section] = {**d.get(section, {}), key: value}
    else:
        d[key] = value
    with pytest.raises(SpecError, match=rf"{key} = .*true|{key} = .*false") as e:
        parse_spec(d)
    assert "holds a YAML boolean (true or false) where a number is expected" in str(e.value)
    d = copy.deepcopy(PRESETS["smoke"])
    d["training"] = {**d.get("training", {}), "compile": True}  # a boolean key still takes a boolean
    assert parse_spec(d).training.compile is True


def test_lr_table_entries_outside_the_grid_are_refused():
    """Extra lr.table sizes (a mistyped 64 for 46) and r values were ignored without a word, while tokens' extra
    sizes were refused."""
    d = copy.deepcopy(PRESETS["smoke"])
    d["lr"] = {"table": {16: 0.01, 32: 0.01, 64: 0.02}}
    with pytest.raises(SpecError, match=r"lr.table has entries for 64, not sizes of the grid \[16, 32\]"):
        parse_spec(d)
    d["lr"] = {"table": {16: {1: 0.01, 2: 0.01, 4: 0.01, 8: 0.01, 3: 0.5}, 32: 0.01}}
    with pytest.raises(SpecError, match=r"lr.table\[16\] has entries for r = 3, not in the grid's r \[1, 2, 4, 8\]"):
        parse_spec(d)
    d["lr"] = {"table": {"16": {"1": 0.01, "2": 0.01, "4": 0.01, "8": 0.01}, "32": 0.01}}  # keys as strings
    assert {c.lr for c in parse_spec(d).cells()} == {0.01}


def test_a_binary_spec_file_names_itself(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_bytes(b"\x1f\x8b\x08\x00binary")
    with pytest.raises(SpecError, match=r"sweep spec .*spec.yaml is not UTF-8 text \(byte b'\\x8b' at offset 1\)"):
        load_spec(p)
    p.write_bytes(b"# " + b"a" * 20000 + b"\n\xff")  # past the text reader's first chunk: the offset in the file
    with pytest.raises(SpecError, match=r"\(byte b'\\xff' at offset 20003\)"):
        load_spec(p)


@pytest.mark.parametrize(
    "section,key,hint",
    [
        ("training", "lr", "the LR is the top-level key lr"),
        ("model", "hc_lanes", "lanes belong to the hyperconnect variant"),
        ("training", "device", "trials run on GPUs when resources.gpus > 0"),
        ("model", "zzz", "the keys of model are: preset, effective_depth, n_prelude"),
        ("", "zzz", "the keys at the top are: name, corpus"),
        ("tune", "num_sample", "did you mean 'num_samples'?"),
        # a section's key put at the top: its place is named (eval_token said "did you mean 'tokens'?")
        ("", "eval_token", "did you mean 'training.eval_tokens'?"),
        ("", "checkpoint_every", "did you mean 'training.checkpoint_every_steps'?"),
        ("", "sizez", "did you mean 'sizes'?"),
    ],
)
def test_an_unknown_key_says_where_it_belongs_or_what_is_allowed(section, key, hint):
    d = copy.deepcopy(PRESETS["smoke"])
    if section:
        d[section] = {**d.get(section, {}), key: 1}
    else:
        d[key] = 1
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    assert f"{section + '.' if section else ''}{key}: Extra inputs are not permitted ({hint}" in str(e.value)


def test_a_folder_of_runs_an_older_loopscale_defined_otherwise_is_refused_with_the_refit_commands(tmp_path):
    """docs/example_cpu_previous_default's spec.yaml is its spec, but its 48 run ids were made by a loopscale that
    defined runs otherwise: `run spec.yaml --out COPY --resume` started training all 48 cells again beside them
    (the fit would have counted both). Runs that are no cells of the folder's own spec are now refused before
    anything is written, naming the commands that refit or report them without training; a folder whose runs are
    today's cells (docs/example_cpu) passes."""
    import shutil

    import yaml

    from loopscale.sweep.spec import FOLDER_SPEC, check_folder_spec

    docs = ROOT / "docs"
    old = tmp_path / "old"
    shutil.copytree(docs / "example_cpu_previous_default", old)
    spec = parse_spec(yaml.safe_load((old / FOLDER_SPEC).read_text()))
    before = sorted((p.name, p.stat().st_size) for p in old.rglob("*"))
    with pytest.raises(ValueError, match=r"48 of its 48 recorded runs are not cells of its spec as this loopscale "
                                         r"defines runs \(.*\): an older loopscale recorded them.*`loopscale fit "
                                         rf"{old} --bootstrap 200 --identify --out {old}_refit`, .*`loopscale "
                                         rf"report {old}`"):
        check_folder_spec(old, spec, corpus=False)
    assert sorted((p.name, p.stat().st_size) for p in old.rglob("*")) == before
    now = tmp_path / "now"
    shutil.copytree(docs / "example_cpu", now, ignore=shutil.ignore_patterns("second_seeds", "half_seeds"))
    check_folder_spec(now, parse_spec(yaml.safe_load((now / FOLDER_SPEC).read_text())), corpus=False)


def test_runs_at_other_lrs_than_the_folders_lr_table_are_refused_as_such(tmp_path):
    """An `lr: tune` folder whose LR table was tuned again (other LRs) holds runs that are no cells of its spec; the
    refusal blamed an older loopscale. It now says they trained at other LRs than the table gives; with several
    variants it gives one refit command per variant (a single `loopscale fit DIR` is refused there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopscale.sweep.spec import RunsDefinedOtherwise, check_folder_runs
    from loopscale.sweep.store import ResultsStore, run_record

    spec = preset_spec("smoke").model_copy(update={"lr": "tune", "variants": ["baseline", "trunc_bptt"]})
    table = {(s, r): 0.01 for s in spec.all_sizes() for r in spec.r}
    out = tmp_path / "f"
    out.mkdir()
    store = ResultsStore(out)
    for c in spec.cells(lr_table=table):
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    store.consolidate()

    def write_table(lr):
        rows = [{"size": s, "r": r, "lr": lr} for (s, r) in table]
        pq.write_table(pa.Table.from_pylist(rows), out / "lr_table.parquet")

    write_table(0.01)
    check_folder_runs(out, spec, same_spec=True)  # the table the runs trained with: today's cells
    write_table(0.0125)
    with pytest.raises(RunsDefinedOtherwise, match="they trained at other LRs than the folder's lr_table.parquet") as e:
        check_folder_runs(out, spec, same_spec=True)
    assert e.value.other_lrs and "an older loopscale" not in str(e.value)
    assert e.value.refit == "; ".join(
        f"`loopscale fit {out} --bootstrap 200 --identify --variant {v} --out {out}_refit_{v}`"
        for v in ("baseline", "trunc_bptt"))  # fmt: skip


@pytest.mark.parametrize(
    "lr, said",
    [
        ({"fixed": "1e-2"}, r"lr.fixed must be a positive number, got '1e-2' \('1e-2' is quoted, so YAML reads it as "
                            r"text: write 0.01 without quotes\)"),
        ({"table": {16: "0.02"}}, r"lr.table\[16\] must be a positive number, got '0.02' \('0.02' is quoted.*write "
                                  r"0.02 without quotes\)"),
        ({"fixed": "abc"}, r"lr.fixed must be a positive number, got 'abc'$"),
    ],
)
def test_a_quoted_lr_says_to_write_it_without_quotes(lr, said):
    """Other quoted numbers of a spec get this hint; a quoted LR was refused without it."""
    with pytest.raises(SpecError, match=said):
        parse_spec({"name": "x", "r": [1, 2], "sizes": [16], "tokens": [20000], "lr": lr})


def test_a_bad_data_seed_is_blamed_on_the_top_level_key():
    """data_seed: -1 was reported as 'training: the run at size 16 ... data_seed must be ...', though data_seed is
    a top-level key of the spec, not one of training's."""
    with pytest.raises(SpecError, match=r"invalid sweep spec: data_seed \(the data order of every run\) must be an "
                                        r"integer in \[0, 4294967295\], got -1$"):  # fmt: skip
        parse_spec({"name": "x", "r": [1, 2], "sizes": [16], "tokens": [20000], "lr": {"fixed": 0.01},
                    "data_seed": -1})  # fmt: skip


def test_cells_of_two_token_budgets_are_not_equal():
    """In tokens mode a cell's D is held only by its run configuration, and cells compared without it: the smoke
    grid's r = 8, d = 32 cells of 2048 and 4096 tokens were equal (one of them was lost from a set)."""
    cells = preset_spec("smoke").cells()
    assert len(set(cells)) == len({c.run_id for c in cells}) == 16
    a, b = (c for c in cells if (c.r, c.size) == (8, 32))
    assert a != b and a.run.tokens != b.run.tokens
    assert a == preset_spec("smoke").cells()[cells.index(a)]  # the same cell built again is equal


@pytest.mark.parametrize(
    "key, value, hint",
    [
        ("learning_rate", 0.01, "the LR is the top-level key lr: tune, {fixed: LR} or {table: ...}"),
        ("seed", 3, "init seeds are the top-level key seeds (a count or a list)"),
        ("seq_len", 64, "the context length is model.seq_len"),
        ("d_model", [16], "widths are the top-level key sizes (or the sizes of budgets)"),
        ("optimizer", "muon", "the optimizer is training.optimizer"),
    ],
)
def test_a_top_level_key_of_another_name_or_section_says_where_it_belongs(key, value, hint):
    """`learning_rate:` at the top got "Extra inputs are not permitted (the keys at the top are: ...)", not the
    key it meant (lr; difflib finds nothing close); a key of another section names that section."""
    with pytest.raises(SpecError) as e:
        parse_spec({**copy.deepcopy(PRESETS["smoke"]), key: value})
    assert f"{key}: Extra inputs are not permitted ({hint})" in str(e.value), str(e.value)


def test_every_problem_across_keys_is_said_at_once():
    """A spec with problems in several independent parts (r, seeds, variants, lr, training) names all of them in
    one error (it named the first, so each fix met the next); lr.table is checked against the sizes only once the
    grid's sizes are valid (a table checked against an empty grid would name every size as foreign)."""
    base = preset_spec("smoke").model_dump(mode="python")
    with pytest.raises(SpecError) as e:
        parse_spec({**base, "r": [1, 3], "seeds": [], "variants": [], "lr": {"fixd": 0.1}, "lr_data_exponent": 0.5})
    msg = str(e.value)
    said = ["r=[3] must divide the looped depth", "seeds must be non-empty", "variants must be non-empty",
            "lr must be 'tune', {fixed: <lr>} or {table: ...}, got keys ['fixd'] (did you mean 'fixed'?)",
            "lr_data_exponent=0.5 scales the Muon matrix LR"]  # fmt: skip
    assert all(s in msg for s in said), msg
    assert [msg.index(s) for s in said] == sorted(msg.index(s) for s in said)  # in the spec's order of parts
    with pytest.raises(SpecError) as e:
        parse_spec({**base, "sizes": [], "lr": {"table": {99: 0.1}}})
    assert "sizes must be non-empty with 'tokens'" in str(e.value) and "lr.table" not in str(e.value)
    with pytest.raises(SpecError, match=r"lr.table has entries for 99, not sizes of the grid \[16, 32\]"):
        parse_spec({**base, "lr": {"table": {99: 0.1}}})


def test_model_copy_replaces_each_key_given_and_a_section_copy_keeps_the_rest():
    """Each key given replaces its value whole, as in a spec file: a section mapping is that section at its defaults
    (merging it into the preset's kept keys that exclude the one given: {"tune": {"tokens_per_param": 20}} was
    refused for tune.tokens set too); the section's own changed copy keeps the preset's other keys."""
    from loopscale.sweep.presets import preset_spec

    smoke = preset_spec("smoke")
    mapped = smoke.model_copy(update={"training": {"batch_tokens": 512}})
    assert mapped.training.batch_tokens == 512 and mapped.training.eval_tokens == type(smoke.training)().eval_tokens
    kept = smoke.model_copy(update={"training": smoke.training.model_copy(update={"batch_tokens": 512})})
    assert (kept.training.batch_tokens, kept.training.eval_tokens, kept.training.checkpoint_every_steps) == (
        512, smoke.training.eval_tokens, smoke.training.checkpoint_every_steps)  # fmt: skip
    assert smoke.model_copy(update={"tune": {"tokens_per_param": 20}}).tune.tokens_per_param == 20
    assert smoke.model_copy(update={"tokens": [4096]}).tokens == [4096]
    with pytest.raises(SpecError, match="training"):
        smoke.model_copy(update={"training": {"batch_tokens": "many"}})


def test_a_folder_of_other_variants_names_them_by_name_and_a_reorder_as_such(tmp_path):
    """A folder of [baseline, trunc_bptt] refused [trunc_bptt, baseline] naming each variant with hc_lanes 2, a key
    those variants refuse, and without saying that only the order differed. Variants are named by name (hyperconnect
    with its lanes), and a reorder says that the order is part of the spec."""
    import re

    import yaml

    from loopscale.sweep.spec import check_folder_spec, spec_to_yaml

    base = yaml.safe_load(spec_to_yaml(preset_spec("smoke")))
    out = tmp_path / "run"
    out.mkdir()
    spec = parse_spec({**base, "variants": ["baseline", "trunc_bptt"]})
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    swapped = parse_spec({**base, "variants": ["trunc_bptt", "baseline"]})
    with pytest.raises(ValueError, match=re.escape(
            "it differs in variants: ['baseline', 'trunc_bptt'] -> ['trunc_bptt', 'baseline'] (the same variants in "
            "another order: the order is part of the spec; list them in the folder's order))")):  # fmt: skip
        check_folder_spec(out, swapped, corpus=False)
    hc = parse_spec({**base, "variants": ["baseline", {"name": "hyperconnect", "hc_lanes": 4}]})
    with pytest.raises(ValueError, match=re.escape(
            "it differs in variants: ['baseline', 'trunc_bptt'] -> ['baseline', 'hyperconnect (hc_lanes 4)'])")):
        check_folder_spec(out, hc, corpus=False)
    # seeds as lists of hundreds of numbers (the cpu preset's): each list is shown by its ends and length
    many = parse_spec({**base, "variants": ["baseline", "trunc_bptt"], "seeds": 40})
    with pytest.raises(ValueError, match=re.escape("[0, 1, 2, ..., 39] (40 values)")) as e:
        check_folder_spec(out, many, corpus=False)
    assert "39, " not in str(e.value) and len(str(e.value)) < 1200
    # lists that differ where the short form cuts them are named by the first item that differs
    (out / "spec.yaml").write_text(spec_to_yaml(parse_spec({**base, "seeds": list(range(10))})))
    with pytest.raises(ValueError, match=re.escape("seeds[5]: 5 -> 100 (of lists of 10 values)")):
        check_folder_spec(out, parse_spec({**base, "seeds": [0, 1, 2, 3, 4, 100, 6, 7, 8, 9]}), corpus=False)


def test_decay_frac_without_wsd_and_bptt_k_in_a_spec_say_what_to_write():
    """``training: {schedule: cosine, decay_frac: 0.5}`` was accepted and changed nothing (decay_frac shapes 'wsd'
    only; `loopscale train --decay-frac` notes the same): it is now said. A ``bptt_k`` in a variant, the training section or at the
    top got the generic list of keys; it is told that trunc_bptt sets k = ceil(r / 2) itself."""
    grid = {**BASE, "sizes": [16, 32], "tokens": [2048]}
    import re
    import warnings

    from loopscale.sweep import spec as spec_module

    spec_module._SAID_SPEC_NOTES.clear()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        # said, not refused: decay_frac is part of the run id, so a folder trained with it still reads its spec
        for _ in range(2):  # said once per process (`status` read the spec twice and said it twice)
            assert parse_spec({**grid, "training": {"schedule": "cosine", "decay_frac": 0.5}}).training.decay_frac == 0.5
    (w,) = said
    assert re.search(r"training.decay_frac \(0.5\) has no effect with schedule 'cosine': .* set schedule: wsd", str(w.message))
    assert w.filename.endswith("spec.py") and "sweep" in w.filename  # a loopscale file: shown as `warning: ...`

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parse_spec({**grid, "training": {"schedule": "wsd", "decay_frac": 0.5}}).training.decay_frac == 0.5
    spec = parse_spec({**grid, "training": {"schedule": "cosine"}})
    assert parse_spec(spec.model_dump(mode="python")) == spec  # a dump writes the default decay_frac: let through
    with pytest.raises(SpecError, match=r"variants.0.bptt_k: .*trunc_bptt sets bptt_k = ceil\(r / 2\) itself"):
        parse_spec({**grid, "variants": [{"name": "trunc_bptt", "bptt_k": 2}]})
    for where in ({"bptt_k": 2}, {"training": {"bptt_k": 2}}):
        with pytest.raises(SpecError, match=r"bptt_k: .*the variant trunc_bptt \(bptt_k = ceil\(r / 2\)\)"):
            parse_spec({**grid, **where})
