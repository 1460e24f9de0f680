"""Write a fit's artefacts: ``fit.json``, ``bootstrap.parquet`` and the PNG figures."""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd


def json_safe(x: Any) -> Any:
    """JSON-safe copy: NaN/inf -> None, numpy scalars and arrays -> Python numbers and lists, tuples -> lists,
    dict keys -> strings."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    if hasattr(x, "tolist") and getattr(x, "ndim", 0) > 0:
        return json_safe(x.tolist())
    if hasattr(x, "item") and not isinstance(x, str):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def summary_dict(fit: Any, boot: Any | None = None) -> dict[str, Any]:
    """The fit's JSON object: ``law``, ``n``, ``params``, ``ci`` (param -> [lo, hi] when bootstrapped), ``r2``,
    ``rmse``, ``max_abs_residual``, ``objective``, ``on_bound``, ``n_excluded``, ``excluded_by_status``,
    ``excluded_duplicates`` (run ids of rows dropped for a newer row of the same run) and, when
    bootstrapped, ``estimate_outside_ci`` (the parameters whose estimate lies outside their own interval),
    ``ci_derived`` (no compute-optimal N*/D*/L* with one token budget D), ``ci_derived_at_search_edge`` (its N*
    intervals with an end on the frontier's search range) and a ``bootstrap`` summary (counts, block columns,
    warm-start share)."""
    d = fit.to_dict()
    d["ci"] = {k: [v[0], v[1]] for k, v in boot.ci.items()} if boot is not None else {}
    if boot is not None:
        bd = boot.to_dict()
        d["ci_derived"] = bd.pop("ci_derived")
        d["ci_derived_at_search_edge"] = bd.pop("ci_derived_at_search_edge")
        bd.pop("ci")
        d["estimate_outside_ci"] = bd.pop("estimate_outside_ci")
        d["bootstrap"] = bd
    return json_safe(d)


#: The files a fit writes to its folder (``loopscale fit --out`` adds ``identification.json``): an earlier fit's
#: are moved aside (:func:`move_earlier_fit`) before a fit writes there.
FIT_FILES = ("fit.json", "bootstrap.parquet", "phi_bootstrap.png", "identification.json", "fit_curves.png",
             "residuals.png")


def move_earlier_fit(out_dir: str | Path) -> dict[str, Any] | None:
    """Move the files of :data:`FIT_FILES` that ``out_dir`` already holds (an earlier fit's, or the user's own of
    those names) into a new folder ``out_dir/earlier_fit_<UTC time>`` (:func:`loopscale.cluster.storage.new_aside_folder`),
    so that a fit writing there loses nothing and leaves no earlier file (a bootstrap, a verdict) that reads as its
    own. Returns ``{"files": [names], "to": folder}``, or None when there was nothing to move (no folder made)."""
    out = Path(out_dir)
    earlier = [n for n in FIT_FILES if (out / n).is_file()]
    if not earlier:
        return None
    from loopscale.cluster.storage import new_aside_folder

    aside = new_aside_folder(out, "earlier_fit")
    for name in earlier:
        (out / name).replace(aside / name)
    return {"files": earlier, "to": str(aside)}


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the block runs (a few renames), then give a signal that came to the handler
    that was there before (``signal.raise_signal``): the block is never stopped part-way. Outside the main thread,
    the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    held = [sig for sig, h in before.items() if h not in (signal.SIG_IGN, None)]
    for sig in held:
        signal.signal(sig, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        for sig in held:
            signal.signal(sig, before[sig])
        for sig in dict.fromkeys(came):
            signal.raise_signal(sig)


@dataclass
class StagedFit:
    """A fit being written (:func:`staged_fit`): ``dir`` the hidden folder its files go to first, ``moved`` what
    the earlier fit's files will be moved to (``{"files": [names], "to": folder}``; None when there are none)."""

    dir: Path
    moved: dict[str, Any] | None


@contextlib.contextmanager
def staged_fit(out_dir: str | Path) -> Iterator[StagedFit]:
    """Write a fit into ``out_dir`` whole or not at all. The block writes the new fit's files into ``.dir`` (a hidden
    folder inside ``out_dir``); when it ends, the earlier fit's files (:data:`FIT_FILES` already there) are moved to
    ``out_dir/earlier_fit_<UTC time>/`` and the new files take their place, with SIGINT and SIGTERM held for those
    renames. When the block fails or is stopped (Ctrl-C), its folder is removed and the earlier fit is left where
    it was. A Ctrl-C while a fit wrote its files directly left the earlier fit moved aside and the new one half
    written (fit.json without its figures), under "nothing partial was kept"."""
    import shutil
    import uuid

    from loopscale.cluster.storage import new_aside_folder

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    earlier = [n for n in FIT_FILES if (out / n).is_file()]
    stage = out / f".fit-writing-{uuid.uuid4().hex[:12]}"
    stage.mkdir()
    aside = None
    try:
        aside = new_aside_folder(out, "earlier_fit") if earlier else None
        yield StagedFit(stage, {"files": earlier, "to": str(aside)} if aside is not None else None)
        with _signals_held():
            for name in earlier:
                (out / name).replace(aside / name)
            for f in sorted(stage.iterdir()):
                f.replace(out / f.name)
            stage.rmdir()
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if aside is not None and aside.is_dir() and not any(aside.iterdir()):
            aside.rmdir()
        raise


#: The folders a ``loopscale run`` writes in its output folder (records, Tune state, logs, TensorBoard files, and
#: ``fit.partial``: where its fit stage writes a fit before it takes ``fit/``'s place; a fit.partial/ the stage did
#: not leave makes ``run`` refuse the folder).
_RUN_OWN_FOLDERS = ("parts", "tune", "tune_lr", "logs", "tensorboard", "fit.partial")


def _command_folder_kind(folder: Path) -> str | None:
    """The loopscale command whose output folder ``folder`` is (``run``, ``sweep``, ``tune-lr``), else None: one with
    ``run_meta.json`` (``run``) or ``logs/command.json``, the record every such command writes when it starts (a
    first ``run`` writes run_meta.json only when its first stage ends), or one with ``runs.parquet`` and
    ``fit/analysis.json`` (``run``: a run's runs and analysis, e.g. copied without its records, from which
    ``loopscale report`` builds its report there)."""
    if (folder / "run_meta.json").is_file():
        return "run"
    if (folder / "runs.parquet").is_file() and (folder / "fit" / "analysis.json").is_file():
        return "run"
    rec = folder / "logs" / "command.json"
    if not rec.is_file():
        return None
    try:
        kind = json.loads(rec.read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        kind = None
    return kind if kind in ("run", "sweep", "tune-lr") else "run"


def check_fit_out_dir(out: str | Path, name: str = "--out") -> None:
    """Refuse a fit's output folder (``loopscale fit --out``, :func:`write_fit_outputs`'s ``out_dir``; ``name``
    says it in the message) among a ``loopscale run``'s own files: in its analysis folder (a folder named ``fit``,
    ``--out`` or one above it, that holds ``analysis.json`` and whose parent holds the run's ``runs.parquet`` or
    ``run_meta.json``; the run's report is built from analysis.json, so a fit.json replaced there would no longer be
    the report's), the run's folder itself (:func:`_command_folder_kind`, which counts such a parent as a run's
    folder too; a loose fit.json beside its report reads as the run's) or one of the folders it writes
    (:data:`_RUN_OWN_FOLDERS`).

    Raises:
        ValueError: such a folder, naming one to use instead."""
    def said(folder: Path | str) -> str:  # a flag and its value, or a Python argument
        return f"{name} {shlex.quote(str(folder))}" if name.startswith("--") else f"{name}={str(folder)!r}"

    p = Path(out).resolve()
    for folder in (p, *p.parents):
        kind = _command_folder_kind(folder)
        if kind and (folder == p or p.relative_to(folder).parts[0] in _RUN_OWN_FOLDERS):
            where = "is the output folder" if folder == p else f"is inside {folder / p.relative_to(folder).parts[0]}"
            raise ValueError(
                f"{said(out)} {where} of the `loopscale {kind}` in {folder}, whose records and report describe its "
                f"runs; write this fit in a folder of its own, e.g. {said(folder / 'my_fit')}"
            )
        run = folder.parent
        if folder.name == "fit" and (folder / "analysis.json").is_file() and (
            (run / "runs.parquet").is_file() or (run / "run_meta.json").is_file()
        ):
            raise ValueError(
                f"{said(out)} is inside {folder}, the analysis of the `loopscale run` in {run}: its report is built "
                f"from {folder / 'analysis.json'} and the fit files beside it; write this fit elsewhere, e.g. "
                f"{said(run / 'my_fit')}"
            )


def write_fit_outputs(
    out_dir: str | Path,
    fit: Any,
    boot: Any | None = None,
    table: pd.DataFrame | None = None,
    plots: bool = True,
    extra: dict[str, Any] | None = None,
    keep_earlier: bool = True,
) -> dict[str, str]:
    """Write ``fit.json`` (:func:`summary_dict`), ``bootstrap.parquet`` (one row per resample, when ``boot``), and PNGs:
    ``fit_curves.png`` (data + fitted curves per r), ``residuals.png`` (residual vs prediction) and, when ``boot`` has
    phi draws, ``phi_bootstrap.png``. ``table`` defaults to the rows the fit used (``fit.data``); ``extra``
    keys (e.g. ``variant``; ``loopscale fit`` adds every key of its ``--json`` but ``outputs``) are added to
    fit.json. Files of those names already in ``out_dir`` (an earlier fit's) are first moved into
    ``out_dir/earlier_fit_<UTC time>`` (:func:`move_earlier_fit`), with a ``UserWarning`` naming them and the folder;
    ``keep_earlier=False`` writes over them (the run's analysis, which writes a whole folder of its own; a file
    this call does not write again, e.g. an earlier ``bootstrap.parquet`` when ``boot`` is None, then stays).
    ``fit`` is a :class:`~loopscale.fit.fitter.FitResult` or what :func:`~loopscale.fit.table_fit.fit_table`
    returns (a :class:`~loopscale.fit.table_fit.TableFit`: its point fit and bootstrap are written, and its
    ``variant`` is added to fit.json when it has one). Returns ``{name: path}`` of the files written.

    With ``keep_earlier`` (the default) ``out_dir`` must not be among a ``loopscale run``'s own files (its folder, its
    ``fit/`` analysis or a folder it writes), as ``loopscale fit --out`` (:func:`check_fit_out_dir`): the run's report
    reads its fit files from there.

    Raises:
        TypeError: ``fit`` or ``boot`` is not one of those (checked before anything in ``out_dir`` is moved), or a
            ``boot`` given beside a TableFit that has its own bootstrap.
        ValueError: with ``keep_earlier``, ``out_dir`` among a run's own files (nothing is moved or written).
    """
    from loopscale.fit.bootstrapping import BootstrapResult
    from loopscale.fit.fitter import FitResult
    from loopscale.fit.table_fit import TableFit

    if isinstance(fit, TableFit):
        if boot is not None and fit.boot is not None and boot is not fit.boot:
            raise TypeError("write_fit_outputs: the TableFit has its own bootstrap; give boot=None to write it, or "
                            "pass its .fit with the bootstrap you mean")
        if fit.variant is not None:
            extra = {"variant": fit.variant, **(extra or {})}
        fit, boot = fit.fit, (fit.boot if boot is None else boot)
    if not isinstance(fit, FitResult):
        raise TypeError(f"write_fit_outputs: fit is a {type(fit).__name__}; give a FitResult (fit_law) or the "
                        "TableFit of fit_table (nothing was written)")
    if boot is not None and not isinstance(boot, BootstrapResult):
        raise TypeError(f"write_fit_outputs: boot is a {type(boot).__name__}; give a BootstrapResult "
                        "(bootstrap) or None (nothing was written)")
    if keep_earlier:  # a run's own fit files are its analysis's (which writes them with keep_earlier=False)
        check_fit_out_dir(out_dir, "out_dir")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if keep_earlier and (moved := move_earlier_fit(out)):
        import warnings

        warnings.warn(f"moved the files already in {out} that a fit writes ({', '.join(moved['files'])}) to "
                      f"{moved['to']}", UserWarning, stacklevel=2)
    files: dict[str, str] = {}
    p = out / "fit.json"
    from loopscale.cluster.storage import write_text_atomic

    write_text_atomic(str(p), json.dumps({**summary_dict(fit, boot), **json_safe(extra or {})}, indent=2, allow_nan=False))
    files["fit.json"] = str(p)
    if boot is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = out / "bootstrap.parquet"
        tab = pa.Table.from_pandas(boot.draws, preserve_index=False)
        meta = {b"loopscale.bootstrap": json.dumps(json_safe(boot.to_dict())).encode()}
        pq.write_table(tab.replace_schema_metadata({**(tab.schema.metadata or {}), **meta}), p)
        files["bootstrap.parquet"] = str(p)
    if plots:
        from loopscale.fit import plots as pl

        frame = fit.data if table is None else table
        if frame is not None:
            files["fit_curves.png"] = str(pl.plot_fit_curves(fit, frame, out / "fit_curves.png"))
            files["residuals.png"] = str(pl.plot_residuals(fit, frame, out / "residuals.png"))
        if boot is not None and "phi" in boot.draws.columns and fit.law == "joint" and not fit.phi_fixed:
            files["phi_bootstrap.png"] = str(
                pl.plot_phi_bootstrap(boot, out / "phi_bootstrap.png", fit.params["phi"])
            )
    return files


def redraw_fit_figures(fit_json: str | Path, frame: pd.DataFrame) -> dict[str, str]:
    """Redraw ``fit_curves.png`` and ``residuals.png`` beside ``fit_json`` (a ``fit.json`` of
    :func:`write_fit_outputs`) from its parameters and ``frame``, the points the law was fitted to, without
    refitting (``loopscale report`` after a change to the figures). Drawn only when ``frame`` is those points: as
    many as the fit's ``n`` and the same R² from its parameters (to 1e-9); else nothing is written.

    Returns:
        ``{name: path}`` of the figures written (empty when ``frame`` is not the fit's points or the file holds no
        fit)."""
    from dataclasses import fields

    from loopscale.fit import plots as pl
    from loopscale.fit.fitter import FitResult, goodness
    from loopscale.fit.io import prepare

    p = Path(fit_json)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
        kw = {f.name: d[f.name] for f in fields(FitResult) if f.name in d and f.name != "data"}
        fit = FitResult(**{**kw, "theta": tuple(kw.get("theta") or ())})
        law = fit.law_object()
        data = prepare(frame, law)
        same = len(data.cols["loss"]) == int(fit.n) and math.isclose(
            goodness(law, fit.params, data)["r2"], float(fit.r2), rel_tol=1e-9, abs_tol=1e-12
        )
    except (OSError, ValueError, TypeError, KeyError):
        return {}
    if not same:
        return {}
    return {
        "fit_curves.png": str(pl.plot_fit_curves(fit, frame, p.parent / "fit_curves.png")),
        "residuals.png": str(pl.plot_residuals(fit, frame, p.parent / "residuals.png")),
    }
