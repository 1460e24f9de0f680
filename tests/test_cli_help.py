"""The console script's --help texts: what is written in an option's help is what the user reads."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from loopscale.sweep.cli import app

# rich markup (Typer's help renderer) takes "[word]" / "[word words]" as a style tag and drops it; "\[" escapes it
_TAG = re.compile(r"(?<!\\)\[[A-Za-z][\w ]*\]")


def _commands(cmd: click.Command, path: str = ""):
    yield path or "loopscale", cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, f"{path} {name}".strip())


def test_no_help_text_loses_a_bracketed_word():
    eaten = []
    for path, cmd in _commands(typer.main.get_command(app)):
        for text in [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]:
            eaten += [(path, m) for m in _TAG.findall(text)]
    assert not eaten, f"bracketed words that --help would drop (escape as '\\['): {eaten}"


def test_track_help_shows_the_extra_to_install():
    res = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert res.exit_code == 0
    assert "pip install -e '.[track]' in the checkout ('.[wandb]' for W&B)" in " ".join(res.output.split())


def test_the_list_of_commands_shows_each_summary_as_one_flowing_line():
    """`loopscale --help` lists each command with its help's first paragraph, line breaks as written in the source
    (Typer's rich mode): fit's and sweep's listed as ragged 5- and 3-line fragments ("Rows whose" / "status is
    not 'ok' ..."). Every listed summary is one paragraph without a line break, and the listing has no cut line."""
    import inspect

    listed = {}
    for path, cmd in _commands(typer.main.get_command(app)):
        if path != "loopscale":
            listed[path] = inspect.cleandoc(cmd.short_help or cmd.help or "").split("\n\n")[0]
    assert {"fit", "sweep", "run", "status"} <= set(listed)
    assert not {p: s for p, s in listed.items() if "\n" in s or not s}, listed
    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("│ fit ")]
    assert rows and "table of runs" in rows[0]


def test_train_help_has_no_source_markup_and_says_what_its_preset_is():
    """`train --help` showed reST literals (``LMLoss``) and Python defaults ("None -> batch_tokens"); its --preset
    (a model family) read like the sweep preset of the same name, whose training settings differ."""
    from loopscale.sweep.presets import preset_spec

    helps = {p.name: p.help or "" for p in typer.main.get_command(app).commands["train"].params}
    assert not [n for n, h in helps.items() if "``" in h or "None ->" in h or "None:" in h]
    assert "if not given: batch_tokens" in helps["micro_batch_tokens"] and "(LMLoss: model" in helps["compile"]
    cpu = preset_spec("cpu")
    said = f"trains with {cpu.training.optimizer.replace('muonh', 'MuonH')} at a fixed LR {cpu.lr['fixed']:g}"
    assert said in helps["preset"]


def test_help_texts_speak_of_the_command_line():
    """train's --checkpoint-every-steps help spoke of train_run, None and Cell.run_config (the Python API); model
    info's --preset help named training flags it does not have; `model info --preset smoke` gave the family list
    without saying smoke is a sweep preset."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    train = " ".join(CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "Write a checkpoint every K steps (and at the last step) into --checkpoint-dir" in train
    assert "run_config" not in train and "train_ensemble" not in train
    info = " ".join(CliRunner().invoke(app, ["model", "info", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "are this command's own flags" not in info and "`train` takes its training settings" in info
    res = CliRunner().invoke(app, ["model", "info", "--preset", "smoke", "--d-model", "16"])
    assert res.exit_code == 2 and "'smoke' is a sweep preset, configs/smoke.yaml" in res.output


def test_version_names_loopscale_and_the_libraries_its_numbers_depend_on():
    """There was no `loopscale --version`: a researcher reporting a result could not say which loopscale (and which
    torch, Ray, Optuna) made it without pip. It prints the installed versions, read from package metadata."""
    import subprocess
    import sys
    from importlib.metadata import version

    res = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "--version"], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip()
    own, deps = line.split(" (", 1)
    assert deps.startswith(f"torch {version('torch')}, ray {version('ray')}, optuna {version('optuna')}, pyarrow "
                           f"{version('pyarrow')}, ")  # fmt: skip
    assert line.endswith(f", python {sys.version.split()[0]})") and "not installed" not in line
    assert own.startswith(f"loopscale {version('loopscale')}")
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout (an editable install): the commit, as the version never changes
        assert own.startswith(f"loopscale {version('loopscale')}+git.{head.stdout.strip()}"), own
    else:
        assert own == f"loopscale {version('loopscale')}"


def _git(cwd: Path, *args: str) -> str:
    import subprocess

    res = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(cwd), *args],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return res.stdout.strip()


def test_version_names_no_commit_of_another_repository_the_package_is_installed_in(tmp_path, monkeypatch):
    """A non-editable install into a .venv inside an unrelated project's git repository reported that project's
    commit (`git -C <package parent>` finds any repository above it). The commit is loopscale's only where the
    package runs from loopscale's own checkout; there it still names the commit and `.dirty`."""
    import shutil
    import subprocess
    import sys
    from importlib.metadata import version

    import loopscale.model.train as train

    if shutil.which("git") is None:
        pytest.skip("no git here")
    src = Path(train.__file__).resolve().parents[1]
    ignore = shutil.ignore_patterns("__pycache__")
    proj = tmp_path / "proj"  # someone's project with loopscale installed into its .venv, the .venv tracked too
    site = proj / ".venv" / "lib" / "site-packages"
    for d in ("model", "sweep", "fit", "cluster"):
        shutil.copytree(src / d, site / "loopscale" / d, ignore=ignore)
    (proj / "pyproject.toml").write_text('[project]\nname = "theirs"\n')
    _git(proj, "init", "-q")
    _git(proj, "add", "-A")
    _git(proj, "commit", "-qm", "their project")
    code = ("import loopscale.model.train as t, pathlib; print(pathlib.Path(t.__file__).resolve()); "
            "print(t.loopscale_version())")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(site)})  # fmt: skip
    assert res.returncode == 0, res.stderr
    where, got = res.stdout.split()
    assert where == str((site / "loopscale" / "model" / "train.py").resolve())  # the installed copy ran
    assert got == version("loopscale")  # not 0.1.0+git.<their commit>
    own = tmp_path / "loopscale"  # loopscale's own checkout: its source root is the repository's top level
    for d in ("model", "sweep", "fit", "cluster"):
        shutil.copytree(src / d, own / d, ignore=ignore)
    shutil.copy(src / "pyproject.toml", own / "pyproject.toml")
    _git(own, "init", "-q")
    _git(own, "add", "-A")
    _git(own, "commit", "-qm", "loopscale")
    sha = _git(own, "rev-parse", "--short", "HEAD")
    spec = importlib.util.spec_from_file_location("checkout_train", own / "model" / "train.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "checkout_train", mod)  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    assert mod.loopscale_version() == f"{version('loopscale')}+git.{sha}"
    # a docs page or a run folder refitted inside the checkout is no change of the code
    (own / "docs").mkdir()
    (own / "docs" / "notes.md").write_text("a\n")
    _git(own, "add", "-A")
    _git(own, "commit", "-qm", "docs")
    sha = _git(own, "rev-parse", "--short", "HEAD")
    (own / "docs" / "notes.md").write_text("b\n")
    assert mod.loopscale_version() == f"{version('loopscale')}+git.{sha}"
    (own / "model" / "train.py").write_text((own / "model" / "train.py").read_text() + "\n")
    assert mod.loopscale_version() == f"{version('loopscale')}+git.{sha}.dirty"


def test_readme_gives_a_default_out_to_the_commands_that_have_one():
    """README said `design`'s --out defaults to runs/<preset or spec file name> as tune-lr's, sweep's and run's do;
    design has no default --out (without one it writes nothing). The commands the README's sentence gives that
    default are those whose --out help states it."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    said = "defaults to `runs/<preset or spec file name>`"
    [sentence] = [x for x in re.split(r"\.\s", " ".join(readme.split())) if said in x]
    named = {c for c in re.findall(r"`([a-z-]+)`", sentence.split(said)[0]) if c in ("tune-lr", "sweep", "run", "design")}
    root = typer.main.get_command(app)
    with_default = set()
    for name in ("tune-lr", "sweep", "run", "design"):
        [out] = [p for p in root.commands[name].params if "--out" in getattr(p, "opts", ())]
        assert out.default is None  # the default is computed from the spec's name, and stated in the help
        if "default: runs/<preset name or spec file name>" in (out.help or ""):
            with_default.add(name)
    assert with_default == {"tune-lr", "sweep", "run"}
    assert named == with_default, sentence


def test_tune_commands_help_does_not_offer_ray_client():
    """`tune-lr`, `sweep` and `run` refuse a ray:// address (Ray Tune's driver would run inside the cluster), but
    their --help listed 'ray://host:port' as a form to give; only `fit` (its --workers bootstrap) takes it."""

    def address_help(cmd):
        text = CliRunner().invoke(app, [cmd, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}).output
        words = " ".join(text.replace("│", " ").split())
        return words[words.index("--address") : words.index("--num-cpus")]

    for cmd in ("tune-lr", "sweep", "run"):
        assert "'ray://host:port'" not in address_help(cmd) and "refused here" in address_help(cmd), cmd
    assert "'ray://host:port'" in address_help("fit")


def test_every_option_in_help_is_in_the_command_reference():
    """docs/cli.md named none of `train`'s 31 run options, `model info`'s model overrides, `fit --phi / --delta` or
    `tune-lr --no-plot`: every option a command's --help lists is now named in docs/cli.md (or, for options every
    Ray-using command shares, in its shared paragraph)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    named = set(re.findall(r"--[a-z][a-z0-9-]*", doc))
    missing = []
    for path, cmd in _commands(typer.main.get_command(app)):
        for p in cmd.params:
            opts = [o for o in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])] if o.startswith("--")]
            if opts and "--help" not in opts and not named.intersection(opts):
                missing.append(f"{path} {opts[0]}")
    assert not missing, f"options in --help that docs/cli.md never names: {missing}"
