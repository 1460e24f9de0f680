"""The ``loopscale`` console script: one thin command per pipeline stage.

Each stage's command lives next to its library code (``loopscale.model.cli``, ``loopscale.fit.cli``,
``loopscale.sweep.commands``) and is registered here, through the one error presenter
(:func:`loopscale.cluster.options.present_errors`: bad input -> "error: ..." and exit 2, SIGINT -> exit 130). Heavy imports (torch, ray, matplotlib) happen inside
the commands, so ``loopscale --help`` is fast.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import typer

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Iso-depth scaling laws for looped language models: measure what one recurrence is worth (phi).",
)


#: The packages ``loopscale --version`` names beside loopscale's own version (the ones a run's numbers depend on).
VERSION_PACKAGES = ("torch", "ray", "optuna", "pyarrow", "numpy", "scipy")


def version_line() -> str:
    """``loopscale <version>`` (:func:`loopscale.model.train.loopscale_version`: with the git commit of a checkout)
    with the installed versions of :data:`VERSION_PACKAGES` and Python, read from the installed distributions'
    metadata (torch and the others are not imported)."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    from loopscale.model.train import loopscale_version

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    deps = ", ".join(f"{n} {v(n)}" for n in VERSION_PACKAGES)
    return f"loopscale {loopscale_version()} ({deps}, python {sys.version.split()[0]})"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True,
        help="Print loopscale's version and those of torch, Ray, Optuna, pyarrow, NumPy, SciPy and Python, then exit.",
    ),
) -> None:
    pass


def _when_idle(cmd, what: str, why: str, *, only_without: str | None = None):
    """``cmd`` (whose first argument is a folder), refused while another command works in that folder
    (:func:`loopscale.sweep.status.refuse_busy_folder`, naming ``what`` and ``why``); with ``only_without``, only
    while the folder lacks that file. ``loopscale report`` on a folder whose `run` was in its LR stage read half its
    files and said runs.parquet was missing, which reads as lost data; ``loopscale fit`` of such a folder called it
    "a folder without runs.parquet" (a folder with its runs table is fitted busy or not: fitting writes nothing
    there)."""
    import functools
    import inspect
    from pathlib import Path

    name = next(iter(inspect.signature(cmd).parameters))  # Typer passes it by name (run_dir, table)

    @functools.wraps(cmd)
    def wrapper(*args, **kwargs):
        from loopscale.sweep.status import refuse_busy_folder

        folder = Path(kwargs[name] if name in kwargs else args[0])
        if only_without is None or (folder.is_dir() and not (folder / only_without).is_file()):
            refuse_busy_folder(folder, what, why=why)
        return cmd(*args, **kwargs)

    return wrapper


def _register() -> None:
    from loopscale.cluster.options import present_errors
    from loopscale.fit import cli as fit_cli
    from loopscale.fit import run_report
    from loopscale.model import cli as model_cli
    from loopscale.sweep import commands as sweep_cmds
    from loopscale.sweep import design_cmd, status
    from loopscale.sweep import run as run_pipeline

    model_app = typer.Typer(no_args_is_help=True, help="Inspect looped model configurations.")
    model_app.command("info")(present_errors(model_cli.info_cmd))
    app.add_typer(model_app, name="model")
    app.command("train")(present_errors(model_cli.train_cmd))
    fit_cli.UNFINISHED_GRID_NOTE = run_pipeline.unfinished_grid_note  # a run folder's runs its spec plans, not there yet
    run_report.RUN_REFUSES = run_pipeline.folder_nothing_to_fit  # a report does not advise a `run` that is refused
    # the list of commands shows a help's first paragraph with its source line breaks: a one-line summary instead
    app.command("fit", short_help="Fit a scaling law (joint: phi) to a table of runs (bootstrap CIs with --bootstrap B).")(
        present_errors(_when_idle(fit_cli.fit_cmd, "`loopscale fit`", "its runs table, runs.parquet, is written when "
                                  "its grid ends", only_without="runs.parquet"))
    )
    app.command("report")(present_errors(_when_idle(
        run_report.report_cmd, "`loopscale report`",
        "it writes the runs table, the fit and the report this would read; its own report is written when it ends")))
    app.command("tune-lr")(present_errors(sweep_cmds.tune_lr_cmd))
    app.command("sweep", short_help="Stage 2: train every grid cell of SPEC on Ray Tune; writes runs.parquet.")(
        present_errors(sweep_cmds.sweep_cmd)
    )
    app.command("run")(present_errors(run_pipeline.run_cmd))
    app.command("design")(present_errors(design_cmd.design_cmd))
    app.command("status")(present_errors(status.status_cmd))


_register()


_ROOT = Path(__file__).resolve().parents[1]
_LOOPSCALE_DIRS = tuple(str(_ROOT / d) + "/" for d in ("model", "sweep", "fit", "cluster"))  # loopscale's own files


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """A warning as the console script shows it: loopscale's own UserWarnings (raised from a file of this package)
    as ``warning: <message>`` (they speak to the user; file and line are for developers); any other warning (a
    library's, a DeprecationWarning) in Python's default format."""
    if issubclass(category, UserWarning) and str(filename).startswith(_LOOPSCALE_DIRS):
        return f"warning: {message}\n"
    return _PYTHON_FORMAT(message, category, filename, lineno, line)


_PYTHON_FORMAT = warnings.formatwarning


#: Folder options typed ``str`` (``train``'s, from its run config) that :func:`empty_path_argument` checks as paths:
#: ``--cache-dir ''`` wrote the token cache into the current directory, ``--checkpoint-dir ''`` took no checkpoint.
FOLDER_OPTIONS = frozenset({"--cache-dir", "--checkpoint-dir"})


def empty_path_argument(argv: list[str]) -> str | None:
    """The refusal of an empty path on the command line ``argv`` (``sys.argv[1:]``), or None: a folder or file
    argument given as ``''`` (``--out "$OUT"`` with ``OUT`` unset) reaches the command as ``Path('')``, the current
    directory, and ``loopscale run smoke --out ''`` wrote a whole run among the files there. Checks every
    argument of a ``pathlib.Path`` type of the command named in ``argv`` (``--out``, ``--pilot``, a folder
    argument) and of :data:`FOLDER_OPTIONS`, as ``--opt ''``, ``--opt=`` or an empty positional in that argument's place (also after a flag or
    ``--``); ``--out .`` still means the current directory."""
    import typer.main

    group = typer.main.get_command(app)
    i, cmd = 0, None
    while i < len(argv) and hasattr(group, "commands"):  # `model info`: a group's subcommand
        if argv[i].startswith("-"):
            return None
        cmd = group.commands.get(argv[i])
        if cmd is None:
            return None
        group, i = cmd, i + 1
    if cmd is None or hasattr(cmd, "commands"):
        return None
    paths = [p for p in cmd.params if "Path" in str(getattr(getattr(p, "type_descriptor", None), "annotation", ""))
             or any(o in FOLDER_OPTIONS for o in p.opts)]  # fmt: skip
    options = {o for p in paths for o in p.opts if o.startswith("-")}
    flags = {o for p in cmd.params if getattr(p, "is_flag", False) for o in (*p.opts, *p.secondary_opts)}
    args = [p for p in cmd.params if not any(o.startswith("-") for o in p.opts)]  # positionals, in order
    rest = argv[i:]

    def empty(name: str) -> str:
        return (f"{name} is empty (an unset shell variable?): an empty path would be the current directory, "
                f"{Path.cwd()}; give the path, or '.' for the current directory")

    j, k, positional_only = 0, 0, False  # k: the positional the next bare argument fills
    while j < len(rest):
        a = rest[j]
        j += 1
        if not positional_only and a == "--":  # everything after it is positional
            positional_only = True
        elif not positional_only and a.startswith("-"):
            if "=" in a:
                opt, value = a.split("=", 1)
                if opt in options and value == "":
                    return empty(opt)
            elif a not in flags:  # an option that takes the next argument as its value
                if a in options and j < len(rest) and rest[j] == "":
                    return empty(a)
                j += 1
        else:
            if a == "" and k < len(args) and args[k] in paths:
                return empty(args[k].metavar or args[k].name.upper())  # the name the usage line gives it
            k += 1
    return None


def main() -> None:
    """The ``loopscale`` command line (the console script runs it through :func:`loopscale.sweep.entry.main`, which
    also covers a Ctrl-C during this module's import and during Python's exit)."""
    import sys

    warnings.formatwarning = _warning_line
    if why := empty_path_argument(sys.argv[1:]):
        from loopscale.cluster.options import EXIT_USAGE

        typer.echo(f"error: {why}", err=True)
        raise SystemExit(EXIT_USAGE)
    app()


if __name__ == "__main__":
    main()
