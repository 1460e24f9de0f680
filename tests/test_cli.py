"""Thin commands: shared option definitions (the model flags are the same on every command that builds a model)
and one error presenter for every command of the console script."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from loopscale.model.options import MODEL_FLAGS
from loopscale.sweep.cli import app

ROOT = Path(__file__).resolve().parents[1]


def _options(*path: str) -> dict[str, object]:
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return {o: p for p in cmd.params for o in p.opts}


@pytest.mark.parametrize("path", [("model", "info"), ("train",)])
def test_every_model_command_takes_every_model_flag(path):
    """`loopscale model info` and `loopscale train` take the same model flags with the same defaults
    (train used to lack --head-dim, --n-prelude and --n-coda)."""
    opts = _options(*path)
    for name, (_, default, flag, _) in MODEL_FLAGS.items():
        assert flag in opts, f"{' '.join(path)} lacks {flag}"
        assert opts[flag].default == default, (flag, opts[flag].default)
        assert opts[flag].name == name


def test_model_flags_reach_the_config():
    """--n-prelude / --n-coda / --head-dim change the model that `model info` describes."""
    import json

    args = ["model", "info", "--preset", "cpu", "--d-model", "64", "--r", "2", "--json"]
    base = json.loads(CliRunner().invoke(app, args).stdout)
    res = CliRunner().invoke(app, [*args, "--n-prelude", "2", "--n-coda", "2", "--head-dim", "32"])
    assert res.exit_code == 0, res.output
    other = json.loads(res.stdout)
    assert other["N_once"] > base["N_once"] and other != base


def test_one_error_presenter():
    """No command module maps errors to exit codes itself; every console command goes through present_errors."""
    offenders = []
    for pkg in ("model", "sweep", "fit", "cluster"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            if f == ROOT / "cluster" / "options.py":
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Call) and ast.unparse(node.func) == "typer.Exit":
                    codes = [ast.unparse(k.value) for k in node.keywords if k.arg == "code"]
                    if codes and codes[0] not in ("1",):  # 1: a finished command reporting a failed result
                        offenders.append(f"{f.relative_to(ROOT)}:{node.lineno} typer.Exit(code={codes[0]})")
    assert offenders == []
    # every registration `<app>.command(...)(<command>)` wraps its command in present_errors (a registration may
    # span lines, e.g. with a short_help)
    tree = ast.parse((ROOT / "sweep" / "cli.py").read_text())
    registrations = [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Call)
        and isinstance(node.func.func, ast.Attribute) and node.func.func.attr == "command"
    ]  # fmt: skip
    assert len(registrations) >= 9
    bare = [ast.unparse(n) for n in registrations
            if not (n.args and isinstance(n.args[0], ast.Call) and ast.unparse(n.args[0].func) == "present_errors")]
    assert bare == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "/nonexistent/run"], "error: "),
        (["model", "info", "--d-model", "100", "--r", "4"],
         "error: --d-model must be divisible by --head-dim: --d-model 100, --head-dim 16 (try --d-model 112)"),
        (["fit", "/nonexistent/runs.parquet"], "error: "),
        # a column given twice was used twice ("(D,r,D)" in the summary)
        (["fit", str(ROOT / "docs" / "example_cpu_previous_default"), "--bootstrap", "3", "--block-by", "D,r,D"],
         "error: --block-by D,r,D: D given twice"),
        # joined the cluster (or failed to find one) although --workers 1 says serial, no Ray
        (["fit", str(ROOT / "docs" / "example_cpu_previous_default"), "--bootstrap", "3", "--workers", "1",
          "--address", "auto"], "error: --workers 1 runs the bootstrap serially, without Ray"),
        # a Ray option beside --workers 1 was taken and did nothing
        (["fit", str(ROOT / "docs" / "example_cpu_previous_default"), "--bootstrap", "3", "--workers", "1",
          "--num-gpus", "1"], "so --num-gpus would change nothing: drop --num-gpus, or --workers"),
    ],
)
def test_errors_are_one_line_and_exit_2(args, message):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


def test_train_takes_one_flag_per_run_config_field_with_its_default():
    """The run flags of `loopscale train` are derived from RunConfig: every field but the model, same default."""
    import dataclasses

    from loopscale.model.train import RunConfig

    opts = _options("train")
    for f in dataclasses.fields(RunConfig):
        if f.name == "model":
            continue
        flag = "--" + f.name.replace("_", "-")
        assert flag in opts, f"train lacks {flag}"
        assert opts[flag].default == f.default, (flag, opts[flag].default, f.default)


def test_presenter_maps_interrupts_to_130_and_keeps_bugs_loud(tmp_path):
    """Interrupted / KeyboardInterrupt -> exit 130 with a --resume hint (none where the --out folder was never
    written); bad input -> 2; any other error is a bug and keeps its traceback."""
    from loopscale.cluster.options import EXIT_INTERRUPTED, EXIT_USAGE, Interrupted, present_errors

    def make(exc):
        def cmd() -> None:
            raise exc

        sub = typer.Typer()
        sub.command("x")(present_errors(cmd))
        sub.command("y")(lambda: None)
        return sub

    res = CliRunner().invoke(make(Interrupted("the sweep was interrupted")), ["x"])
    assert res.exit_code == EXIT_INTERRUPTED == 130 and "--resume" in res.output
    res = CliRunner().invoke(make(KeyboardInterrupt()), ["x"])
    # a command without --resume must not tell the user to rerun it with --resume (fit, design, train, ...)
    assert res.exit_code == 130 and "--resume" not in res.output and "rerun the command to start again" in res.output

    def resumable(resume: bool = typer.Option(False, "--resume")) -> None:
        raise KeyboardInterrupt

    sub = typer.Typer()
    sub.command("x")(present_errors(resumable))
    sub.command("y")(lambda: None)
    res = CliRunner().invoke(sub, ["x"])
    assert res.exit_code == 130 and "what had finished is kept, rerun the same command with --resume" in res.output

    def with_out(out: Path = typer.Option(..., "--out"), resume: bool = typer.Option(False, "--resume")) -> None:
        raise KeyboardInterrupt

    sub.command("z")(present_errors(with_out))
    tmp = tmp_path
    for out, said in ((tmp, "what had finished is kept, rerun the same command with --resume"),  # it was written
                      (tmp / "new", f"interrupted: stopped before anything was written to {tmp / 'new'}; rerun the "
                                    "command to start")):  # a Ctrl-C before the first write: nothing to resume
        res = CliRunner().invoke(sub, ["z", "--out", str(out)])
        assert res.exit_code == 130 and said in res.output and ("--resume" in res.output) == (out == tmp), res.output
    res = CliRunner().invoke(make(FileNotFoundError("no such spec")), ["x"])
    assert res.exit_code == EXIT_USAGE == 2 and "error: no such spec" in res.output
    res = CliRunner().invoke(make(ZeroDivisionError("bug")), ["x"])
    assert res.exit_code == 1 and isinstance(res.exception, ZeroDivisionError)


def test_out_in_the_way_and_broken_yaml_are_refused_before_any_work(tmp_path):
    """A file where --out (or its parent) should be a directory, and a spec with a YAML syntax error, are one
    error line with exit 2 from every command that writes there, before any Ray start or fit; nothing is written."""
    blocker = tmp_path / "afile"
    blocker.write_text("keep me")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nr: [1, 2\n")
    spec = str(ROOT / "configs" / "smoke.yaml")
    runs = tmp_path / "runs.csv"
    runs.write_text("loss,D,N\n3.0,1e6,1e6\n")
    cases = [
        (["run", "--preset", "smoke", "--out", str(blocker / "sub"), "--dry-run"],
         f"error: --out {blocker / 'sub'} cannot be created: {blocker} is a file; give a directory (new or existing)"),
        (["run", "--preset", "smoke", "--out", str(blocker)],
         f"error: --out {blocker} is a file; give a directory (new or existing)"),
        (["sweep", spec, "--out", str(blocker / "x")], f"cannot be created: {blocker} is a file; give a directory"),
        (["tune-lr", spec, "--out", str(blocker / "x")], f"cannot be created: {blocker} is a file; give a directory"),
        (["fit", str(runs), "--law", "chinchilla", "--out", str(blocker / "x")],
         f"cannot be created: {blocker} is a file; give a directory"),
        (["run", str(broken), "--out", str(tmp_path / "o")], "not valid YAML"),
        (["sweep", str(broken), "--out", str(tmp_path / "o")], "line 2"),
    ]
    for args, message in cases:
        res = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
        assert res.exit_code == 2, (args, res.output)
        assert message in " ".join(res.output.split()) and "Traceback" not in res.output, (args, res.output)
    assert blocker.read_text() == "keep me" and not (tmp_path / "o").exists()


def test_fit_says_whether_phi_is_identified_and_takes_a_run_folder(tmp_path, monkeypatch):
    """`loopscale fit --identify` on a joint law with phi free prints the identification rule's verdict (as
    `loopscale run`), also as `identification` in --json and identification.json with --out; without it the fit
    says it did not check, and restricted or Chinchilla fits have no verdict. A run folder stands for its
    runs.parquet; a folder without one is refused."""
    import json

    import numpy as np

    from loopscale.fit import identify as ident_mod

    profile = ident_mod.phi_profile  # a coarse grid keeps the test short; the rule is tested in test_identify.py
    monkeypatch.setattr(ident_mod, "phi_profile", lambda t, **kw: profile(t, np.arange(-1.5, 2.6, 0.5), **kw))
    run_dir = ROOT / "docs" / "example_cpu_previous_default"  # 48 runs, E on the search bound there
    args = ["fit", str(run_dir), "--starts", "10", "--identify", "--bootstrap", "4", "--workers", "1"]
    res = CliRunner().invoke(app, [*args, "--json", "--out", str(tmp_path / "f")])
    assert res.exit_code == 0, res.output
    ident = json.loads(res.stdout)["identification"]
    assert ident["identified"] is False and ident["headline"].startswith("phi not identified by this grid")
    assert ident["causes"] and json.loads((tmp_path / "f" / "identification.json").read_text()) == ident
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and f"identification: {ident['headline']}" in res.stdout
    res = CliRunner().invoke(app, ["fit", str(run_dir / "runs.parquet"), "--starts", "10"])
    assert res.exit_code == 0 and "identification: not checked; --identify" in res.stdout
    for extra in ([], ["--phi", "0.5"], ["--law", "chinchilla", "--r", "4"]):
        res = CliRunner().invoke(app, ["fit", str(run_dir), "--starts", "10", "--json", *extra])
        assert res.exit_code == 0, (extra, res.output)
        assert "identification" not in json.loads(res.stdout), extra
    res = CliRunner().invoke(app, ["fit", str(tmp_path)])
    assert res.exit_code == 2 and "is a folder without runs.parquet" in res.output
    # --identify without resamples would accept phi with the interval and per-r checks unmade: refused
    res = CliRunner().invoke(app, ["fit", str(run_dir), "--identify"])
    assert res.exit_code == 2 and "--identify needs --bootstrap B" in res.output
    # --identify where there is no phi to identify: said, not silently ignored
    for extra, flag in ((["--phi", "0.5"], "drop --phi"), (["--law", "chinchilla", "--r", "4"], "drop --law chinchilla")):
        res = CliRunner().invoke(app, ["fit", str(run_dir), "--identify", *extra])
        assert res.exit_code == 2 and "--identify applies to the joint law with phi free" in res.output, res.output
        assert flag in res.output


def test_fit_and_model_errors_name_the_flags():
    """Error hints speak the command line's language: --phi only where phi exists, plain numbers, --d-model."""
    rows = "loss,D,N\n3.0,1e6,1e6\n3.1,2e6,1e6\n"
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        few = Path(d) / "few.csv"
        few.write_text(rows)
        res = CliRunner().invoke(app, ["fit", str(few), "--law", "chinchilla"])
        assert res.exit_code == 2 and "add runs" in res.output and "phi" not in res.output, res.output
        neg = Path(d) / "neg.csv"
        neg.write_text(rows.replace("3.1", "-1.0"))
        res = CliRunner().invoke(app, ["fit", str(neg), "--law", "chinchilla"])
        assert res.exit_code == 2 and "line 3 of the CSV has -1.0" in res.output and "np." not in res.output, res.output
    res = CliRunner().invoke(app, ["model", "info", "--preset", "cpu"])
    assert res.exit_code == 2 and "--d-model" in res.output and "--width-scale" in res.output, res.output


def test_console_script_shows_a_warning_as_one_line(tmp_path):
    """The console script prints a UserWarning as `warning: <message>` (not Python's `file.py:N: UserWarning:`
    with the source line under it), and the run's JSON lists it among its warnings."""
    import subprocess
    import sys

    corpus = tmp_path / "c" / "a.txt"
    corpus.parent.mkdir()
    corpus.write_bytes(("Some plain English prose for a tiny run. " * 200).encode() + "caf\xe9".encode("latin-1"))
    exe = str(Path(sys.executable).with_name("loopscale"))
    p = subprocess.run(
        [exe, "train", "--d-model", "16", "--tokens", "2048", "--eval-tokens", "512", "--batch-tokens", "512",
         "--corpus", str(corpus.parent), "--json"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "LOOPSCALE_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "not valid UTF-8" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: corpus file ") and "UserWarning" not in p.stderr
    assert any("not valid UTF-8: 1 invalid" in w for w in json.loads(p.stdout)["warnings"])


def test_warning_format_shortens_only_loopscales_own_warnings():
    """loopscale's UserWarnings read `warning: <message>`; a library's (or a DeprecationWarning) keeps Python's
    format with its file and line, so it does not pass for one of ours."""
    from loopscale.model.data import CorpusWarning
    from loopscale.sweep import cli

    ours = str(ROOT / "model" / "data.py")
    assert cli._warning_line("bad bytes", CorpusWarning, ours, 3) == "warning: bad bytes\n"
    lib = "/usr/lib/python3/site-packages/torch/x.py"
    assert cli._warning_line("old api", UserWarning, lib, 7).startswith(f"{lib}:7: UserWarning: old api")
    assert "DeprecationWarning" in cli._warning_line("gone", DeprecationWarning, ours, 3)


def test_train_data_line_says_how_the_corpus_was_split():
    from loopscale.model.train_cli import _split_text

    assert _split_text({"split_rule": "token tail 0.05", "n_train_docs": 1, "n_val_docs": 0}) == (
        "1 document, split by position: the last 5% of the tokens are validation"
    )
    assert _split_text({"split_rule": "token tail 0.05", "n_train_docs": None, "n_val_docs": None}).startswith(
        "a token file, split by position"
    )
    assert _split_text({"split_rule": "document", "n_train_docs": 40, "n_val_docs": 2}) == (
        "40 train / 2 validation documents; split by document"  # a cache built before the names were kept
    )
    # which documents are validation (a new user saw a 0.4 nats train-val gap on 2 of 37 files, and no names)
    assert _split_text({"split_rule": "document", "n_train_docs": 40, "n_val_docs": 2,
                        "val_doc_names": ["b.txt", "a.txt"]}) == (
        "40 train / 2 validation documents: b.txt, a.txt; split by document"
    )  # fmt: skip
    assert _split_text({"split_rule": "document", "n_train_docs": 900, "n_val_docs": 45,
                        "val_doc_names": [f"d{i}" for i in range(20)]}).endswith("d19 and 25 more; split by document")


def test_a_token_cache_names_its_validation_documents(tmp_path):
    """A folder corpus's cache records its validation documents' names (``val_doc_names``, at most
    VAL_NAMES_KEPT, corpus order) and a run's ``data`` carries them: the documents the rule
    int(sha256(name)[:8], 16) % 20 == 0 picks."""
    from loopscale.model.data import VAL_NAMES_KEPT, is_validation_doc
    from loopscale.model.train import RunConfig, train_run

    corpus = tmp_path / "c"
    corpus.mkdir()
    names = [f"doc{i}.txt" for i in range(60)]
    for i, n in enumerate(names):
        (corpus / n).write_text(f"Document {i}. " + "The quick brown fox jumps over the lazy dog. " * 20)
    want = sorted(n for n in names if is_validation_doc(n))
    assert 1 <= len(want) <= VAL_NAMES_KEPT  # (the rule's pick of these 60 names)
    from loopscale.model.config import preset_config

    res = train_run(RunConfig(model=preset_config("cpu", r=1, d_model=16, seq_len=32), tokens=512, batch_tokens=256,
                              eval_tokens=256, lr=0.01, corpus=str(corpus), cache_dir=str(tmp_path / "cache")))  # fmt: skip
    assert sorted(res.data["val_doc_names"]) == want and res.data["n_val_docs"] == len(want)


@pytest.mark.parametrize(
    "args, got",
    [([], "got neither: e.g. d_model=16"), (["--d-model", "640", "--width-scale", "10"], "got both (d_model=640, ")],
)
def test_model_info_without_a_width_says_what_to_give(args, got):
    """`model info` with no width said only 'give exactly one of d_model or width_scale': it now says which was
    wrong (neither or both) and gives an example of each."""
    res = CliRunner().invoke(app, ["model", "info", *args])
    assert res.exit_code == 2 and got in res.output and "width_scale=10 (d = 64 s = 640" in res.output, res.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--d-model", "16"], "give exactly one of --tokens D (training tokens) or --target-flops C"),
        (["--d-model", "16", "--tokens", "4096", "--target-flops", "1e9"], "give exactly one of --tokens D"),
        (["--d-model", "16", "--r", "2", "--tokens", "4096", "--seeds", "2", "--checkpoint-every-steps", "1"],
         "--checkpoint-every-steps needs --checkpoint-dir DIR"),
        (["--d-model", "16", "--tokens", "4096", "--seeds", "1,,2"], "--seeds 1,,2: an empty entry"),  # was [1, 2]
        # the run's own checks named its Python fields ("eval_every_steps must be None or a positive integer")
        (["--d-model", "16", "--tokens", "4096", "--eval-every-steps", "0"],
         "error: --eval-every-steps must be a positive integer, got 0"),
        (["--d-model", "16", "--tokens", "4096", "--batch-tokens", "7"],
         "error: --batch-tokens must be a positive multiple of --seq-len 128, got 7"),
        (["--d-model", "16", "--tokens", "4096", "--r", "2", "--effective-depth", "7"],
         "error: --r 2 must divide the looped depth (--effective-depth - --n-prelude - --n-coda = 5)"),
        (["--d-model", "16", "--tokens", "4096", "--grad-clip", "-1"], "error: --grad-clip must be > 0, got -1.0"),
    ],
)
def test_train_names_the_flags_of_a_bad_run_before_training(args, message):
    """`train` said 'give exactly one of tokens (D) or target_flops (C)' (field names, not flags), and a missing
    --checkpoint-dir came after the 'training 2 seeds ...' line; both are said first, with the flags' names."""
    res = CliRunner().invoke(app, ["train", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "training" not in res.output.split("error:")[0]


def test_checkpoint_and_config_errors_are_said_with_the_train_flags():
    """A checkpoint of a seed ensemble of another seed count was refused as one that 'differs in ['data_seeds',
    'seeds']' ('use another checkpoint_dir'), keys the command line has no flag for; field names inside paths or
    quotes, and messages that already name flags, are left as they are."""
    import click

    from loopscale.model.options import in_flag_words

    cmd = typer.main.get_command(app).commands["train"]
    ctx = click.Context(cmd)
    said = in_flag_words("checkpoint 'runs/checkpoint_dir/ckpt-4.pt' belongs to a different run (differs in "
                         "['data_seeds', 'model.d_model', 'seeds']); use another checkpoint_dir or delete it", ctx)
    assert said == ("checkpoint 'runs/checkpoint_dir/ckpt-4.pt' belongs to a different run (differs in --seeds, "
                    "--d-model); use another --checkpoint-dir or delete it")
    assert in_flag_words("D differs in ['D', 'corpus_hash']", ctx) == "D differs in D, corpus_hash"  # no flags
    kept = "give exactly one of d_model or width_scale (--d-model / --width-scale on the command line)"
    assert in_flag_words(kept, ctx) == kept
    assert in_flag_words("seed must be an integer in [0, 9], got -1", ctx) == "--seed must be an integer in [0, 9], got -1"
    assert in_flag_words("the seed must not be r", ctx) == "the seed must not be r"  # one-word names only as subject
    info = click.Context(typer.main.get_command(app).commands["model"].commands["info"])
    not_a_flag = "eval_every_steps must be None or a positive integer"  # not a flag of `model info`: kept whole
    assert in_flag_words(not_a_flag, info) == not_a_flag


def test_fit_says_which_loss_column_it_fitted_when_a_table_has_two(tmp_path):
    """A table with both ``loss`` and ``final_val_loss`` was fitted on ``loss`` without a word; when the two differ
    the fit now says which one it used (also as ``loss_column_note`` in --json), and says nothing when they agree."""
    import json

    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    N = np.repeat([1e6, 3e6, 1e7, 3e7], 3)
    D = np.tile([1e8, 3e8, 1e9], 4)
    loss = 1.8 + 400 * N**-0.34 + 400 * D**-0.28 + rng.normal(0, 0.005, N.size)
    # and N and N_unique (the Chinchilla law's N), the same way, for a table holding both
    for fitted, alias, key, values in (("loss", "final_val_loss", "loss_column_note", loss),
                                       ("N", "N_unique", "n_column_note", N)):  # fmt: skip
        for other, says in ((values * 1.5, True), (values, False)):
            path = tmp_path / f"{fitted}{int(says)}.csv"
            pd.DataFrame({"N": N, "D": D, "loss": loss, alias: other}).to_csv(path, index=False)
            res = CliRunner().invoke(app, ["fit", str(path), "--law", "chinchilla", "--starts", "20"])
            assert res.exit_code == 0, res.output
            assert (f"note: the table has both {fitted} and {alias}, and they differ: the {fitted} column was "
                    "fitted" in res.stdout) is says, res.stdout  # fmt: skip
            res = CliRunner().invoke(app, ["fit", str(path), "--law", "chinchilla", "--starts", "20", "--json"])
            assert (key in json.loads(res.stdout)) is says
            # fit_table ("loopscale fit as one call") said neither (input_warnings empty, no UserWarning)
            import warnings

            from loopscale.fit import fit_table

            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                tf = fit_table(path, "chinchilla", starts=20)
            assert (fitted in tf.column_notes) is says
            assert any(str(w.message) == f"table: {tf.column_notes[fitted]}" for w in seen) if says else not any(
                "the table has both" in str(w.message) for w in seen)  # fmt: skip


def test_fit_warns_when_the_runs_hold_fewer_points_than_the_law_has_parameters():
    """`fit docs/example_cpu --r 2,4,8` (3 cells of 64 seeds) printed phi = -0.498 (-0.650 with --seed 1) with R^2
    0.49 and no warning: 3 points cannot pin down 6 parameters. It now says so (--json: ``underdetermined``); the
    whole table's 8 cells say nothing."""
    import json

    example = str(Path(__file__).resolve().parents[1] / "docs" / "example_cpu")
    res = CliRunner().invoke(app, ["fit", example, "--r", "2,4,8", "--starts", "5"])
    assert res.exit_code == 0, res.output
    # one D: E + B D^-beta is one constant, so 6 parameters leave 4 for the points to hold
    assert ("warning: the runs hold 3 distinct points (N_once, N_rec, r, D) for the 4 free parameters left with one "
            "D (E + B D^-beta is one constant): no parameter, phi included, is pinned down by them") in res.stdout  # fmt: skip
    got = json.loads(CliRunner().invoke(app, ["fit", example, "--r", "1,2", "--starts", "5", "--json"]).stdout)
    assert "underdetermined" not in got  # 4 points (2 widths x 2 r) for the 4 free parameters: held
    # phi fixed: 3 free parameters (the constant, A, alpha) for 3 points: held, not said to be underdetermined
    got = json.loads(CliRunner().invoke(app, ["fit", example, "--r", "2,4,8", "--starts", "5", "--phi", "0.5",
                                              "--json"]).stdout)  # fmt: skip
    assert "underdetermined" not in got
    whole = json.loads(CliRunner().invoke(app, ["fit", example, "--starts", "5", "--json"]).stdout)
    assert "underdetermined" not in whole


def test_fit_says_when_cells_with_more_seeds_weigh_more(tmp_path):
    """Per-r seeds ({1: 1, 2: 2}) on a grid of several D: every run is a point of the fit, so the r = 2 cells weighed
    twice, and neither `fit` nor the report said so. Both now do (--json: ``uneven_seeds``); a grid with as many
    seeds in every cell says nothing."""
    import json

    import numpy as np
    import pandas as pd

    from loopscale.fit.run_report import fitted_points

    rng = np.random.default_rng(0)
    rows = []
    for d, n_once, n_rec in ((16, 2e4, 1e4), (32, 8e4, 4e4), (64, 3e5, 1.5e5)):
        for r in (1, 2):
            for D in (1e6, 3e6, 1e7):
                for seed in range(r):  # one seed at r = 1, two at r = 2
                    loss = 2.0 + 300 * (n_once + r**0.5 * n_rec) ** -0.3 + 200 * D**-0.3 + rng.normal(0, 0.003)
                    rows.append(dict(d_model=d, r=r, N_once=n_once, N_rec=n_rec, D=D, seed=seed, loss=loss))
    uneven, even = tmp_path / "uneven.csv", tmp_path / "even.csv"
    pd.DataFrame(rows).to_csv(uneven, index=False)
    pd.DataFrame(rows).drop_duplicates(["d_model", "r", "D"]).to_csv(even, index=False)
    res = CliRunner().invoke(app, ["fit", str(uneven), "--starts", "10"])
    assert res.exit_code == 0, res.output
    line = ("each run is one point and the 18 cells hold 1 to 2 runs (r = 1: 1; r = 2: 2), so cells with more runs "
            "weigh more in the fit")  # fmt: skip
    assert line in res.stdout, res.stdout
    got = json.loads(CliRunner().invoke(app, ["fit", str(uneven), "--starts", "10", "--json"]).stdout)
    assert got["uneven_seeds"] == {"cells": 18, "runs_per_cell": [1, 2], "by_r": {"1": [1, 1], "2": [2, 2]}}
    res = CliRunner().invoke(app, ["fit", str(even), "--starts", "10", "--json"])
    assert res.exit_code == 0 and "uneven_seeds" not in json.loads(res.stdout)
    # the report's n = ... says it too
    assert fitted_points({"uneven_seeds": got["uneven_seeds"]}, {"n": 27}) == f"27 runs; {line}"
    # seed replicates fitted as cell means weigh each cell once: nothing said (it was, from the table's runs);
    # --per-run fits the runs, and then their unequal seeds weigh
    example = Path(__file__).resolve().parents[1] / "docs" / "example_cpu"  # 32 seeds per plain cell, 64 per looped
    for extra, says in (([], False), (["--per-run"], True)):
        res = CliRunner().invoke(app, ["fit", str(example), "--starts", "5", "--json", *extra])
        assert res.exit_code == 0 and ("uneven_seeds" in json.loads(res.stdout)) is says, res.output


@pytest.mark.parametrize("seeds", [[], ["--seeds", "2"]])
def test_train_json_of_a_diverged_run_is_strict_json_and_exits_1(tmp_path, monkeypatch, seeds):
    """`train --json` on a run that diverges exits 1 as the text output does (it exited 0), and prints strict
    JSON: the diverged run's NaN tokens/s is null (json.loads(parse_constant=...) refused `NaN`)."""
    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "a.txt"
    corpus.write_text("Some plain English prose for a tiny run, said again and again. " * 300)
    args = ["train", "--d-model", "16", "--tokens", "8192", "--eval-tokens", "512", "--batch-tokens", "1024",
            "--diverge-loss", "3", "--corpus", str(corpus), "--json", *seeds]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1, res.output

    def refuse(c):
        raise AssertionError(f"non-strict JSON constant {c}")

    out = json.loads(res.stdout.strip().splitlines()[-1], parse_constant=refuse)
    rows = out if isinstance(out, list) else [out]
    assert rows and all(r["status"] == "diverged" for r in rows)
    if not seeds:  # the text output: D and C are the run's definition (they name its cell), and what it trained
        text = CliRunner().invoke(app, args[:-1])
        assert text.exit_code == 1, text.output
        k, F = out["diverged_step"], out["flops_per_token"]
        assert f"D: 8192 (as defined; trained {k * 1024} tokens, {k} step{'s' * (k != 1)}, before it diverged)" in (
            text.output)
        assert f"(as defined; spent {F * k * 1024:.4g} FLOPs before it diverged)" in text.output


def test_train_and_model_info_name_the_flags_that_change_nothing(trainer_corpus_dir, trainer_cache_dir, tmp_path):
    """Flags the model or run ignores were recorded without a word: --hc-lanes without hyperconnections,
    --n-prelude at r = 1, --decay-frac without the wsd schedule, --checkpoint-dir without a checkpoint cadence.
    Each is now a warning, also in the --json warnings; a flag that acts (or one left at its default) is not."""
    runner = CliRunner()
    info = runner.invoke(app, ["model", "info", "--d-model", "16", "--r", "1", "--hc-lanes", "4", "--n-prelude", "2"])
    assert info.exit_code == 0, info.output
    assert "warning: --hc-lanes 4 has no effect: the lanes belong to --injection hyperconnect" in info.output
    assert "warning: --n-prelude has no effect at r = 1" in info.output
    quiet = runner.invoke(app, ["model", "info", "--d-model", "16", "--r", "2", "--injection", "hyperconnect",
                                "--hc-lanes", "4", "--n-prelude", "2", "--n-coda", "2"])  # fmt: skip
    assert quiet.exit_code == 0 and "warning" not in quiet.output, quiet.output
    run = ["train", "--d-model", "16", "--r", "2", "--seq-len", "32", "--tokens", "512", "--batch-tokens", "256",
           "--eval-tokens", "256", "--corpus", str(trainer_corpus_dir), "--cache-dir", str(trainer_cache_dir)]  # fmt: skip
    res = runner.invoke(app, [*run, "--json", "--hc-lanes", "3", "--decay-frac", "0.3"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert [w.split(":")[0] for w in out["warnings"][:2]] == ["--hc-lanes 3 has no effect", "--decay-frac 0.3 has no effect"]
    assert "this run's schedule is linear" in out["warnings"][1]
    res = runner.invoke(app, [*run, "--schedule", "wsd", "--decay-frac", "0.3", "--checkpoint-dir", str(tmp_path / "ck")])
    assert res.exit_code == 0, res.output
    assert "decay-frac" not in res.output and "warning: --checkpoint-dir without --checkpoint-every-steps" in res.output


def test_train_stopped_by_sigterm_says_so_and_exits_143(trainer_corpus_dir, trainer_cache_dir, tmp_path):
    """`train` ended on a SIGTERM (a scheduler's stop, `kill`) without a word; it now stops as on Ctrl-C, says how
    to continue from its checkpoints, and exits 143."""
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-c", "from loopscale.sweep.cli import main; main()", "train", "--d-model", "32",
           "--seq-len", "32", "--tokens", "20000000", "--batch-tokens", "256", "--eval-tokens", "256",
           "--corpus", str(trainer_corpus_dir), "--cache-dir", str(trainer_cache_dir),
           "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every-steps", "5"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list((tmp_path / "ck").glob("ckpt-*.pt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert "interrupted (SIGTERM): stopped; rerun the same command to continue from the newest checkpoint" in err
    assert "Traceback" not in err and out == ""


def test_train_shows_its_validation_curve_and_the_warnings_it_recorded():
    """`train --eval-every-steps k` evaluated every k steps but showed only the final loss (plain and --json);
    `--eval-tokens 100` was rounded up to a whole window and `--lr 0` trained nothing, both without a word. The
    curve is in --json ("curve") and on the console, and each recorded warning is said once."""
    args = ["train", "--d-model", "16", "--r", "2", "--tokens", "4000", "--batch-tokens", "512", "--eval-tokens", "100",
            "--eval-every-steps", "2", "--lr", "0"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    evals = [(p["step"], p["val_loss"]) for p in out["curve"] if p["val_loss"] is not None]
    assert out["D"] == 4096 and [s for s, _ in evals] == [2, 4, 6, 8] and evals[-1][1] == out["final_val_loss"]
    assert len({round(v, 6) for _, v in evals}) == 1  # lr 0: every evaluation sees the initial model
    assert "eval_tokens=100 rounded up to 128 (whole windows of seq_len=128)" in out["warnings"]
    assert "lr=0: no parameter moves, so the final loss is the initial model's" in out["warnings"]
    assert "tokens=4000 rounded to D=4096 (whole steps of batch_tokens=512)" in out["warnings"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert f"val_loss by step: 2: {evals[0][1]:.4f}, 4: " in res.stdout
    for w in ("eval_tokens=100 rounded up to 128", "lr=0: no parameter moves", "tokens=4000 rounded to D=4096"):
        assert res.stderr.count(w) == 1, (w, res.stderr)
    assert "precision=bf16" not in res.stderr
    # bf16 on a CPU trained about 2.4x slower than fp32 at this width, without a word
    res = CliRunner().invoke(app, [*args[:-2], "--precision", "bf16", "--json"])
    assert res.exit_code == 0, res.output
    assert any(w.startswith("precision=bf16 on a CPU: bf16 autocast is meant for GPUs")
               for w in json.loads(res.stdout)["warnings"])  # fmt: skip


def test_train_console_says_how_the_run_trains():
    """The console showed the grid point (r, d, D, C) but not how it trained: a --bptt-k 2 run differed only by its
    C, and optimizer, LR, precision and compile were in --json alone. A second line now says them."""
    res = CliRunner().invoke(app, ["train", "--d-model", "16", "--r", "4", "--tokens", "2048", "--batch-tokens",
                                   "1024", "--bptt-k", "2", "--optimizer", "muonh", "--lr", "0.02"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert ("  muonh (newton_schulz), lr=0.02 (linear), linear injection, bptt_k=2 of r=4, seed=0, fp32, compile "
            "off, 1 thread on cpu\n") in res.stderr, res.stderr
    res = CliRunner().invoke(app, ["train", "--d-model", "16", "--r", "2", "--tokens", "2048", "--batch-tokens", "1024",
                                   "--optimizer", "muon", "--lr-data-factor", "2", "--injection", "hyperconnect"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert ("  muon (newton_schulz), lr=0.003 x 2 for the Muon matrices (linear), hyperconnect injection (2 lanes), "
            "seed=0") in res.stderr, res.stderr
    res = CliRunner().invoke(app, ["train", "--d-model", "16", "--r", "2", "--tokens", "2048", "--batch-tokens",
                                   "1024", "--seeds", "0,3"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "  adamw, lr=0.003 (linear), linear injection, fp32, compile off, 1 thread on cpu\n" in res.stderr, res.stderr
    # --device auto said "1 thread on auto": it names the device it picked (a CPU here)
    res = CliRunner().invoke(app, ["train", "--d-model", "16", "--tokens", "2048", "--batch-tokens", "1024",
                                   "--device", "auto"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "compile off, 1 thread on cpu (auto)\n" in res.stderr, res.stderr


def test_an_ensembles_console_output_shows_each_members_validation_curve():
    """`train --seeds k --eval-every-steps n` showed only each member's final loss on the console (the curve was in
    --json alone), where a single run shows its curve. Each member's line is now followed by its curve, equal to
    its --json curve."""
    args = ["train", "--d-model", "16", "--tokens", "2048", "--batch-tokens", "256", "--seq-len", "32",
            "--eval-tokens", "256", "--eval-every-steps", "2", "--seeds", "0,3"]  # fmt: skip
    rows = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    for o in rows:
        curve = ", ".join(f"{p['step']}: {p['val_loss']:.4f}" for p in o["curve"] if p["val_loss"] is not None)
        assert curve.startswith("2: ") and curve.count(":") == 4  # steps 2, 4, 6, 8
        i = next(i for i, x in enumerate(lines) if x.startswith(f"seed {o['seed']:>4}: ok"))
        assert lines[i + 1] == f"{'':>11}val_loss by step: {curve}", lines


def test_a_compiled_runs_throughput_note_separates_the_compilation(monkeypatch):
    """`train --compile` reported 636 tokens/s (the first step held 32 s of compilation) beside 45 976 eager, and
    said nothing; a compiled run's warnings now give the first step's time and the rate after it."""
    import loopscale.model.looped as looped
    from loopscale.model import RunConfig, preset_config
    from loopscale.model.train import compile_time_note

    cfg = RunConfig(model=preset_config("cpu", r=2, d_model=16), tokens=4096, batch_tokens=512, compile=True)
    monkeypatch.setattr(looped, "compile_fallback", lambda enabled, device="cpu": None)
    note = compile_time_note(cfg, "cpu", 4096 / 32.5, 4096, 32.5, 32.15, 512)
    assert note == ("tokens_per_s (126) includes torch.compile's compilation, in the first step (32.1 s of 32.5 s "
                    "of training steps); the steps after it trained 10,240 tokens/s")  # fmt: skip
    assert compile_time_note(cfg, "cpu", 1.0, 512, 1.0, 1.0, 512) is None  # one step: nothing after it
    eager = RunConfig(model=preset_config("cpu", r=2, d_model=16), tokens=4096, batch_tokens=512)
    assert compile_time_note(eager, "cpu", 1.0, 4096, 32.5, 32.15, 512) is None


def test_train_line_counts_one_step_in_the_singular():
    """'D=256 tokens (1 steps)' read as a typo; one step is '1 step', more are 'steps'."""
    for tokens, steps in (("129", "(1 step)"), ("512", "(2 steps)")):
        res = CliRunner().invoke(app, ["train", "--d-model", "16", "--seq-len", "32", "--batch-tokens", "256",
                                       "--eval-tokens", "64", "--tokens", tokens])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert f"D={256 if tokens == '129' else 512} tokens {steps}," in res.stderr, res.stderr


def test_a_position_split_names_the_documents_its_validation_tail_covers(tmp_path):
    """A corpus split by position said only "the last 5% of the tokens are validation", not of which file; the
    cache now records the documents the tail covers (``val_tail_docs``: names in corpus order, how many, the share
    of the first that stays training) and the ``data`` line names them."""
    from loopscale.model.config import preset_config
    from loopscale.model.data import VAL_TAIL_FRAC, _tail_documents, is_validation_doc
    from loopscale.model.train import RunConfig, train_run
    from loopscale.model.train_cli import _split_text

    corpus = tmp_path / "c"
    corpus.mkdir()
    sizes = {"a.txt": 3000, "b.txt": 4000, "c.txt": 200}
    assert not any(is_validation_doc(n) for n in sizes)  # no document is validation-named: split by position
    for n, k in sizes.items():
        (corpus / n).write_text(("lorem ipsum dolor sit amet " * 200)[:k])
    res = train_run(RunConfig(model=preset_config("cpu", r=1, d_model=16, seq_len=32), tokens=512, batch_tokens=256,
                              eval_tokens=256, lr=0.01, corpus=str(corpus), cache_dir=str(tmp_path / "cache")))  # fmt: skip
    d = res.data
    total = sum(k + 1 for k in sizes.values())  # bytes, and one separator per document
    n_val = round(total * VAL_TAIL_FRAC)
    assert d["split_rule"].startswith("token tail") and d["n_val_tokens"] == n_val
    assert n_val > sizes["c.txt"] + 1  # the tail begins inside b.txt and takes all of c.txt
    before = sizes["b.txt"] + 1 - (n_val - sizes["c.txt"] - 1)
    assert d["val_tail_docs"] == {"names": ["b.txt", "c.txt"], "n_docs": 2,
                                  "first_from": round(before / (sizes["b.txt"] + 1), 4), "complete": True}
    share = 1 - d["val_tail_docs"]["first_from"]
    assert _split_text(d) == (f"3 documents, split by position: the last 5% of the tokens are validation: the last "
                              f"{share:.0%} of b.txt, c.txt")  # fmt: skip
    # a tail longer than the documents remembered says so; one that begins with a document takes it whole
    assert _tail_documents([("x", 10), ("y", 5)], 40) == {"names": ["x", "y"], "n_docs": 2, "first_from": 0.0,
                                                          "complete": False}  # fmt: skip
    assert _tail_documents([("x", 10), ("y", 5)], 5)["first_from"] == 0.0
    assert _split_text({"split_rule": "token tail 0.05", "n_train_docs": 3, "n_val_docs": 0,
                        "val_tail_docs": {"names": ["x", "y"], "n_docs": 2, "first_from": 0.0, "complete": False}}
                       ).endswith("validation: x, y and earlier documents")  # fmt: skip
    assert _split_text({"split_rule": "token tail 0.05", "n_train_docs": 3, "n_val_docs": 0,
                        "val_tail_docs": {"names": ["x"], "n_docs": 1, "first_from": 0.998, "complete": True}}
                       ).endswith("validation: the last under 1% of x")  # fmt: skip
    assert _split_text({"split_rule": "token tail 0.05", "n_train_docs": 3, "n_val_docs": 0,
                        "val_tail_docs": {"names": ["x", "y"], "n_docs": 2, "first_from": 0.0042, "complete": True}}
                       ).endswith("validation: the last over 99% of x, y")  # 4 of x's 957 tokens stay training


def test_fit_of_a_stopped_sweeps_folder_says_which_planned_runs_are_missing(tmp_path):
    """`loopscale fit DIR` on a folder whose sweep was stopped fitted the runs there were (φ, R², "0 excluded") and
    never said that 4 of the 16 planned runs, among them a width's r = 1 runs, were not trained yet. It now counts
    and names them (console warning, `unfinished_grid` in --json); a finished grid gets no such line."""
    import json

    import numpy as np

    from loopscale.sweep.presets import preset_spec
    from loopscale.sweep.spec import spec_to_yaml
    from loopscale.sweep.store import ResultsStore, run_record

    spec = preset_spec("smoke")
    (tmp_path / "spec.yaml").write_text(spec_to_yaml(spec))
    cells = spec.cells()
    rng = np.random.default_rng(0)
    store = ResultsStore(tmp_path)
    left = [c for c in cells if (c.size, c.r) == (16, 1) or (c.size, c.r, c.run.tokens) == (16, 2, min(x.run.tokens for x in cells))]
    assert 0 < len(left) < len(cells)

    def record(c):  # a loss from the joint law at phi = 0.5, with the counts the trainer would record
        from loopscale.model.accounting import flops_per_token, n_once, n_rec, train_flops
        from loopscale.model.train import resolve_tokens

        m, D = c.run.model, resolve_tokens(c.run)
        got = {"N_once": n_once(m), "N_rec": n_rec(m), "D": D, "C": train_flops(m, D), "flops_per_token": flops_per_token(m)}
        n = got["N_once"] + c.r**0.5 * got["N_rec"]
        loss = 1.5 + 40 * n**-0.35 + 300 * got["D"] ** -0.35 + 0.003 * rng.standard_normal()
        return run_record(c, {"status": "ok", "final_val_loss": float(loss), **got})

    for c in cells:
        if c not in left:
            store.write_run(record(c))
    store.consolidate()
    res = CliRunner().invoke(app, ["fit", str(tmp_path), "--starts", "10", "--json"])
    assert res.exit_code == 0, res.output
    note = json.loads(res.stdout)["unfinished_grid"]
    assert note.startswith(f"{tmp_path}'s spec plans {len(cells)} runs and runs.parquet holds {len(cells) - len(left)} "
                           f"of them: {len(left)} not trained yet (r = 1, size 16, D = ")
    assert f"`loopscale status {tmp_path}` says what is left" in note
    for given in (tmp_path, tmp_path / "runs.parquet"):  # the folder, or its table by its file
        res = CliRunner().invoke(app, ["fit", str(given), "--starts", "10"])
        assert res.exit_code == 0 and f"  warning: {note}" in res.stdout.splitlines(), res.stdout
    # a copy of the table outside its folder: no spec to count against
    import shutil

    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "runs.parquet", tmp_path / "copy" / "runs.parquet")
    res = CliRunner().invoke(app, ["fit", str(tmp_path / "copy" / "runs.parquet"), "--starts", "10", "--json"])
    assert res.exit_code == 0 and "unfinished_grid" not in json.loads(res.stdout)
    # too few runs trained for the law: the fit's refusal said "add runs"; it now says they are not trained yet
    few = tmp_path / "few"
    few.mkdir()
    (few / "spec.yaml").write_text(spec_to_yaml(spec))
    for c in [c for c in cells if c not in left][:3]:
        ResultsStore(few).write_run(record(c))
    ResultsStore(few).consolidate()
    res = CliRunner().invoke(app, ["fit", str(few), "--starts", "10"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and ("3 run(s) left is fewer than the 6 parameters of law 'joint'; add runs; "
                                   f"{few}'s spec plans {len(cells)} runs and runs.parquet holds 3 of them: "
                                   f"{len(cells) - 3} not trained yet (") in text, text  # fmt: skip
    assert f"train them first: `loopscale status {few}` gives the command that does" in text
    for c in left:
        store.write_run(record(c))
    store.consolidate()
    res = CliRunner().invoke(app, ["fit", str(tmp_path), "--starts", "10", "--json"])
    assert res.exit_code == 0 and "unfinished_grid" not in json.loads(res.stdout)


def test_a_rerun_of_a_finished_checkpointed_train_says_nothing_was_trained(tmp_path):
    """Rerunning a finished `train --checkpoint-dir` printed its results again as if it had trained them: it now
    says it resumed from the checkpoint of the last step and trained nothing (a single run and an ensemble)."""
    for extra, name in (([], "one"), (["--seeds", "0,1"], "two")):
        ck = tmp_path / name
        args = ["train", "--d-model", "16", "--tokens", "2048", "--batch-tokens", "1024", "--checkpoint-dir", str(ck),
                "--checkpoint-every-steps", "1", *extra]  # fmt: skip
        first = CliRunner().invoke(app, args)
        assert first.exit_code == 0, first.output
        assert "resumed:" not in first.stderr
        again = CliRunner().invoke(app, args)
        assert again.exit_code == 0, again.output
        assert (f"resumed: the checkpoint in {ck} is of the last step (2 of 2): nothing was trained again; the "
                "results above are the finished run's, measured again") in again.stderr, again.stderr  # fmt: skip
