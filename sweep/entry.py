"""The ``loopscale`` console script's entry point: :func:`main`, light enough to cover the command's whole life.

Two windows of a Ctrl-C lie outside what a command itself can catch
(:func:`loopscale.cluster.options.present_errors`):

* **Start-up.** Importing the commands (:mod:`loopscale.sweep.cli`: Typer, pandas, the spec code) takes most of a
  second; a Ctrl-C there showed Python's traceback of whatever import it hit. It now prints one ``interrupted:``
  line and exits 130, as a Ctrl-C later does.
* **Exit.** Once a command has done its work and printed its last line, Python's own shutdown (module teardown,
  a few tenths of a second with torch and pandas loaded) puts SIGINT back to its default action, and a Ctrl-C
  there killed the finished command: exit status 130 with no word, as if it had been stopped (seen with
  ``loopscale report``, its report already written). SIGINT is now ignored from the moment the command returns,
  so the exit status is the command's own. Not where a thread that is not a daemon is still alive (Python waits
  for it, and a Ctrl-C must still reach it) or where SIGINT was not Python's default handler.

This module imports nothing of loopscale at import time.
"""

from __future__ import annotations

import signal
import sys
import threading

EXIT_INTERRUPTED = 130
"""Exit code of a Ctrl-C during start-up: :data:`loopscale.cluster.options.EXIT_INTERRUPTED` (not imported here,
as the import is what a Ctrl-C interrupts)."""

STARTUP_INTERRUPTED = "interrupted: stopped while loopscale was starting; nothing was done, rerun the command"
"""The line of a Ctrl-C during start-up (stderr)."""


def main() -> None:
    """Run the ``loopscale`` command line (:func:`loopscale.sweep.cli.main`) with the start-up and exit windows
    covered (module docstring). Exits through ``SystemExit`` with the command's exit code, or 130 after a Ctrl-C
    during start-up."""
    try:
        from loopscale.sweep.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write(STARTUP_INTERRUPTED + "\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    try:
        cli_main()
    finally:
        ignore_sigint_while_exiting()


def ignore_sigint_while_exiting() -> bool:
    """Ignore SIGINT from now on, for a process whose command has ended and which only exits; returns whether it
    did. Left as it is outside the main thread, where SIGINT's handler is not Python's default one (a job started
    in the background ignores it already; a caller may have its own), or while a thread that is not a daemon is
    alive (Python's exit waits for it, and a Ctrl-C must still be able to stop that wait)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return True
