"""The console script's entry point (loopscale.sweep.entry): a Ctrl-C while the commands are imported, and one while
Python exits after a command has ended."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

from loopscale.cluster.options import EXIT_INTERRUPTED
from loopscale.sweep import entry


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_a_ctrl_c_while_the_commands_are_imported_says_one_line_and_exits_130():
    """A Ctrl-C during the imports (here: when pandas is imported) showed that import's traceback; it is now the
    start-up line and exit 130."""
    p = _python("""
        import os, signal, sys

        class CtrlCAtPandas:  # a Ctrl-C lands while pandas is being imported
            def find_spec(self, name, path=None, target=None):
                if name == "pandas":
                    os.kill(os.getpid(), signal.SIGINT)
                return None

        sys.meta_path.insert(0, CtrlCAtPandas())
        sys.argv = ["loopscale", "--help"]
        from loopscale.sweep.entry import main
        main()
    """)
    assert p.returncode == EXIT_INTERRUPTED == entry.EXIT_INTERRUPTED, (p.returncode, p.stderr)
    assert p.stderr == entry.STARTUP_INTERRUPTED + "\n" and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_a_ctrl_c_while_python_exits_after_the_command_leaves_its_exit_status():
    """A Ctrl-C in Python's module teardown after the command had printed its last line killed the process (the
    shell's 130, no word): a module whose teardown sends SIGINT stands in for the user. The command's output and
    exit status stay; through cli.main (no entry point) the same teardown kills it, which is what the entry covers."""
    late = """
        import os, signal, sys, types

        class CtrlCAtTeardown:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)

        late = types.ModuleType("late_mod")
        late.obj = CtrlCAtTeardown()
        sys.modules["late_mod"] = late
        del late
        sys.argv = ["loopscale", "--version"]
    """
    p = _python(textwrap.dedent(late) + "from loopscale.sweep.entry import main\nmain()\n")
    assert p.returncode == 0, (p.returncode, p.stderr)
    assert p.stdout.startswith("loopscale ") and p.stderr == ""
    bare = _python(textwrap.dedent(late) + "from loopscale.sweep.cli import main\nmain()\n")
    assert bare.returncode == -signal.SIGINT and bare.stdout.startswith("loopscale ")


def test_sigint_is_ignored_at_exit_only_with_python_s_handler_and_no_live_thread_to_wait_for():
    before = signal.getsignal(signal.SIGINT)
    release = threading.Event()
    worker = threading.Thread(target=release.wait)  # not a daemon: Python's exit would wait for it
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        worker.start()
        assert entry.ignore_sigint_while_exiting() is False
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        release.set()
        worker.join()
        mine = lambda *a: None  # noqa: E731  (a caller's own handler stays)
        signal.signal(signal.SIGINT, mine)
        assert entry.ignore_sigint_while_exiting() is False and signal.getsignal(signal.SIGINT) is mine
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert entry.ignore_sigint_while_exiting() is True
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        release.set()
        signal.signal(signal.SIGINT, before)


def test_the_entry_module_imports_nothing_heavy():
    """What a Ctrl-C can interrupt before main() runs is Python's own start and this module's import."""
    p = _python("""
        import sys
        import loopscale.sweep.entry
        heavy = [m for m in ("typer", "pandas", "torch", "ray", "loopscale.sweep.cli") if m in sys.modules]
        print(heavy)
    """)
    assert p.returncode == 0 and p.stdout.strip() == "[]", (p.stdout, p.stderr)
