"""The ``loopscale`` console script's entry point: :func:`main`, light enough to cover the command's whole life.

Two windows of a Ctrl-C lie outside what a command itself can catch
(:func:`loopscale.cluster.options.present_errors`):

* **Start-up**, from the first import to the command's own code: importing the commands
  (:mod:`loopscale.sweep.cli`: Typer, pandas, the spec code) takes most of a second, then Typer builds and parses
  the command line. A Ctrl-C there showed Python's traceback of whatever import it hit, or (during Typer's parse)
  ended with exit 130 and no word; a SIGTERM killed the process without a word. :func:`main` now handles both
  itself until the command's code starts (:func:`startup_sigint`; the presenter hands them back then): one
  ``interrupted:`` line, exit 130 (SIGTERM: 143). Python's own start and this module's import (the first few
  hundredths of a second) come before any handler can be set.
* **Exit.** Once a command has done its work and printed its last line, Python's shutdown (module teardown, a few
  tenths of a second with torch and pandas loaded) puts SIGINT back to its default action, and a Ctrl-C there
  killed the finished command: exit status 130 with no word, as if it had been stopped (seen with ``loopscale
  report``, its report already written). SIGINT is ignored from the end of Python's exit hooks on
  (:func:`ignore_sigint_at_teardown`, the first exit hook registered, so the last to run), so the exit status is
  the command's own. Threads and the other exit hooks (e.g. a tracker's flush) can still be stopped with Ctrl-C.

This module imports nothing of loopscale at import time.
"""

from __future__ import annotations

import atexit
import signal
import sys
import threading

EXIT_INTERRUPTED = 130
"""Exit code of a Ctrl-C during start-up: :data:`loopscale.cluster.options.EXIT_INTERRUPTED` (not imported here,
as the import is what a Ctrl-C interrupts)."""

EXIT_TERMINATED = 143
"""Exit code of a SIGTERM during start-up: :data:`loopscale.cluster.options.EXIT_TERMINATED`."""

STARTUP_INTERRUPTED = "interrupted: stopped while loopscale was starting; nothing was done, rerun the command"
"""The line of a Ctrl-C during start-up (stderr)."""


class StartupInterrupted(BaseException):
    """A Ctrl-C or SIGTERM (``args[0]``: the signal number) before the command's own code ran (raised by
    :func:`startup_sigint`). A ``BaseException`` other than ``KeyboardInterrupt``, so that Typer's parse (which
    turns a ``KeyboardInterrupt`` into a silent exit 130) lets it through to :func:`main`."""


def startup_sigint(signum, frame) -> None:
    """SIGINT and SIGTERM handler of the start-up: raises :class:`StartupInterrupted`. Marked
    ``loopscale_startup``, the attribute :func:`loopscale.cluster.options.present_errors` looks for to give the
    signals back to their default handlers as the command's own code starts."""
    raise StartupInterrupted(signum)


startup_sigint.loopscale_startup = True  # type: ignore[attr-defined]


def main() -> None:
    """Run the ``loopscale`` command line (:func:`loopscale.sweep.cli.main`) with the start-up and exit windows
    covered (module docstring). Exits through ``SystemExit`` with the command's exit code, or 130 after a Ctrl-C
    during start-up."""
    atexit.register(ignore_sigint_at_teardown)  # registered first: runs after every exit hook registered later
    if threading.current_thread() is threading.main_thread():
        # (a job started in the background ignores SIGINT, and a caller may have handlers of its own: they stay)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, startup_sigint)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, startup_sigint)
    try:
        from loopscale.sweep.cli import main as cli_main

        cli_main()
    except StartupInterrupted as e:
        _quiet_startup_handlers()  # a second press while the line is written, or while Python exits
        term = bool(e.args) and e.args[0] == signal.SIGTERM
        line = STARTUP_INTERRUPTED.replace("interrupted: ", "interrupted (SIGTERM): ", 1) if term else STARTUP_INTERRUPTED
        sys.stderr.write(line + "\n")
        raise SystemExit(EXIT_TERMINATED if term else EXIT_INTERRUPTED) from None
    finally:  # --help, --version, a usage error: ended in Typer's parse, the start-up handlers still in place
        _quiet_startup_handlers()


def _quiet_startup_handlers() -> None:
    """Where the start-up handler is still in place (the command's code never ran): SIGINT ignored and SIGTERM
    back to its default, for the rest of a process that only exits."""
    if signal.getsignal(signal.SIGINT) is startup_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if signal.getsignal(signal.SIGTERM) is startup_sigint:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def ignore_sigint_at_teardown() -> bool:
    """Ignore SIGINT from now on, for a process that is past its command and its other exit hooks; returns whether
    it did. Left as it is outside the main thread, or where SIGINT's handler is neither Python's default one nor
    :func:`startup_sigint` (a job started in the background ignores it already; a caller may have its own)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, startup_sigint):
        return False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return True
