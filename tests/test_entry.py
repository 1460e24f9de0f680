"""The console script's entry point (loopscale.sweep.entry): a Ctrl-C while the commands are imported, and one while
Python exits after a command has ended."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

from loopscale.cluster.options import EXIT_INTERRUPTED, EXIT_TERMINATED
from loopscale.sweep import entry

#: The child's first line: SIGINT handled as Python starts at a terminal. A shell starts a background job
#: (``pytest ... &``, nohup) with SIGINT ignored, Python then installs no handler of its own, and each press these
#: tests make was ignored (exit 0). Set in the child's code, not in a ``preexec_fn`` (unsafe with threads).
AS_AT_A_TERMINAL = "import signal as _signal; _signal.signal(_signal.SIGINT, _signal.default_int_handler)\n"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", AS_AT_A_TERMINAL + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def _signal_at_import(sig: str, module: str = "pandas") -> str:
    """Code that sends this process ``signal.<sig>`` as ``module`` starts to be imported (a press mid-import)."""
    return textwrap.dedent(f"""
        import os, signal, sys

        class SignalAtImport:
            def find_spec(self, name, path=None, target=None):
                if name == {module!r}:
                    os.kill(os.getpid(), signal.{sig})
                return None

        sys.meta_path.insert(0, SignalAtImport())
    """)


def test_a_ctrl_c_while_the_commands_are_imported_says_one_line_and_exits_130():
    """A Ctrl-C during the imports (here: when pandas is imported) showed that import's traceback; it is now the
    start-up line and exit 130."""
    p = _python(_signal_at_import("SIGINT") + textwrap.dedent("""
        sys.argv = ["loopscale", "--help"]
        from loopscale.sweep.entry import main
        main()
    """))
    assert p.returncode == EXIT_INTERRUPTED == entry.EXIT_INTERRUPTED, (p.returncode, p.stderr)
    assert p.stderr == entry.STARTUP_INTERRUPTED + "\n" and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_a_sigterm_while_the_commands_are_imported_says_one_line_and_exits_143():
    """A SIGTERM in the start-up killed the process without a word (the commands stop on SIGTERM as on Ctrl-C
    only once their code runs)."""
    p = _python(_signal_at_import("SIGTERM") + textwrap.dedent("""
        sys.argv = ["loopscale", "--help"]
        from loopscale.sweep.entry import main
        main()
    """))
    assert p.returncode == entry.EXIT_TERMINATED == EXIT_TERMINATED, (p.returncode, p.stderr)
    assert p.stderr == entry.STARTUP_INTERRUPTED.replace("interrupted:", "interrupted (SIGTERM):") + "\n"


def test_a_second_ctrl_c_while_the_start_up_line_is_written_is_ignored():
    """A second press as the start-up line was written raised again inside the handling (exit 1, a chained
    traceback): the start-up handlers are quieted before the line is written."""
    p = _python(_signal_at_import("SIGINT") + textwrap.dedent("""
        class PressAgain:
            def __init__(self, f):
                self.f = f

            def write(self, text):
                os.kill(os.getpid(), signal.SIGINT)
                return self.f.write(text)

            def __getattr__(self, name):
                return getattr(self.f, name)

        sys.stderr = PressAgain(sys.stderr)
        sys.argv = ["loopscale", "--help"]
        from loopscale.sweep.entry import main
        main()
    """))
    assert p.returncode == EXIT_INTERRUPTED, (p.returncode, p.stderr)
    assert p.stderr == entry.STARTUP_INTERRUPTED + "\n"


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


def test_a_ctrl_c_while_typer_builds_and_parses_the_command_line_says_one_line_and_exits_130():
    """After the imports and before the command's own code, Typer builds the command tree and parses the line; a
    Ctrl-C there showed a traceback (building) or ended with exit 130 and no word (Typer's parse turns a
    KeyboardInterrupt into a silent exit 130)."""
    for where in ("get_command", "parse_args"):
        p = _python(f"""
            import os, signal, sys
            import typer.core, typer.main

            if {where!r} == "get_command":
                build = typer.main.get_command

                def get_command(app):
                    os.kill(os.getpid(), signal.SIGINT)
                    return build(app)

                typer.main.get_command = get_command
            else:
                parse = typer.core.TyperCommand.parse_args

                def parse_args(self, ctx, args):
                    os.kill(os.getpid(), signal.SIGINT)
                    return parse(self, ctx, args)

                typer.core.TyperCommand.parse_args = parse_args
            sys.argv = ["loopscale", "model", "info", "--d-model", "16", "--r", "2"]
            from loopscale.sweep.entry import main
            main()
        """)
        assert p.returncode == EXIT_INTERRUPTED, (where, p.returncode, p.stderr)
        assert p.stderr == entry.STARTUP_INTERRUPTED + "\n", (where, p.stderr)


def test_the_command_s_own_code_gets_python_s_sigint_handler_back():
    """The start-up handler ends where the command's code starts: a Ctrl-C in the command is its own (here
    `model info` stopped in its body: the presenter's line, not the start-up one), and a command run in-process
    (no console script) keeps whatever handler it had."""
    p = _python("""
        import os, signal, sys
        import loopscale.model.cli as model_cli

        def info_cmd():
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            os.kill(os.getpid(), signal.SIGINT)

        model_cli.info_cmd = info_cmd
        sys.argv = ["loopscale", "model", "info"]
        from loopscale.sweep.entry import main
        main()
    """)
    assert p.returncode == EXIT_INTERRUPTED, p.stderr
    assert p.stderr.startswith("interrupted: stopped;") and "starting" not in p.stderr, p.stderr


def test_sigint_is_ignored_at_teardown_only_with_python_s_or_the_start_up_handler():
    before = signal.getsignal(signal.SIGINT)
    try:
        mine = lambda *a: None  # noqa: E731  (a caller's own handler stays)
        signal.signal(signal.SIGINT, mine)
        assert entry.ignore_sigint_at_teardown() is False and signal.getsignal(signal.SIGINT) is mine
        for handler in (signal.default_int_handler, entry.startup_sigint):
            signal.signal(signal.SIGINT, handler)
            assert entry.ignore_sigint_at_teardown() is True
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        # a command that ended in Typer's parse (--help, --version): its start-up handlers are quieted as it exits
        term_before = signal.signal(signal.SIGTERM, entry.startup_sigint)
        signal.signal(signal.SIGINT, entry.startup_sigint)
        try:
            entry._quiet_startup_handlers()
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        finally:
            signal.signal(signal.SIGTERM, term_before)
        out: list[bool] = []
        signal.signal(signal.SIGINT, signal.default_int_handler)
        t = threading.Thread(target=lambda: out.append(entry.ignore_sigint_at_teardown()))
        t.start()
        t.join()
        assert out == [False] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
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
