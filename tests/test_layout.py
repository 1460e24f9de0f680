"""Project layout invariants: one-way data flow between the four packages, README and CI agree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# package -> loopscale packages it may import (data flows config -> sweep -> cluster -> model -> results -> fit)
ALLOWED = {
    "model": {"model"},
    "cluster": {"cluster"},
    "fit": {"fit", "cluster"},
    "sweep": {"sweep", "model", "fit", "cluster"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for n in names:
            parts = n.split(".")
            if parts[0] == "loopscale" and len(parts) > 1:
                found.add(parts[1])
            if parts[0] in ALLOWED:  # a bare top-level import like `import model` would break once installed
                found.add("BARE:" + parts[0])
    return found


def test_packages_import_only_downstream_packages():
    """model/ and cluster/ import nothing else of ours; fit/ only fit/ and cluster/; no bare `import model`."""
    bad = []
    for pkg, allowed in ALLOWED.items():
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for imp in _imports(f):
                if imp.startswith("BARE:") or imp not in allowed:
                    bad.append(f"{f.relative_to(ROOT)} imports {imp}")
    assert not bad, "\n".join(bad)


def test_readme_test_command_is_what_ci_runs():
    """The README's second quick-start command is exactly the command .ci/run executes."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```(?:bash|sh)?\n(.*?)```", readme, re.S)
    assert block, "README has no Quick start code block"
    cmds = [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert len(cmds) == 2, f"quick start must be exactly two commands, got {cmds}"
    assert "loopscale run" in cmds[0]
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert cmds[1] in ci, f"{cmds[1]!r} not found in .ci/run"
    assert "pytest" in cmds[1]


def test_pyproject_maps_packages_under_loopscale():
    """The four folders install as loopscale.<name>; nothing installs a bare top-level `model`."""
    text = (ROOT / "pyproject.toml").read_text()
    for pkg in ALLOWED:
        assert f'"loopscale.{pkg}" = "{pkg}"' in text
    assert 'loopscale = "loopscale.sweep.entry:main"' in text


def test_readme_layout_table_lists_every_module():
    """The README's layout table named neither model/ensemble.py nor model/muon.py, fit/identify.py, fit/ladder.py or
    fit/table_fit.py, which the README describes elsewhere: every module (and script) of the four folders is in it,
    in its folder's rows, and the table names no file that is gone."""
    readme = (ROOT / "README.md").read_text()
    table = re.search(r"\| folder \| file \| role \|\n(.*?)\n\n", readme, re.S)
    assert table, "README has no layout table"
    listed: dict[str, set[str]] = {}
    folder = None
    for row in table.group(1).splitlines()[1:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        folder = cells[0].strip("`/") or folder
        listed.setdefault(folder, set()).update(re.findall(r"`([\w./-]+)`", cells[1]))
    for pkg in ALLOWED:
        files = {p.name for p in (ROOT / pkg).iterdir() if p.suffix in (".py", ".sh") and p.name != "__init__.py"}
        files |= {p.name + "/" for p in (ROOT / pkg).iterdir() if p.is_dir() and p.name != "__pycache__"}
        assert files - listed.get(pkg, set()) == set(), f"{pkg}/ files missing from the README's layout table"
        assert listed.get(pkg, set()) - files == set(), f"{pkg}/ rows of the README's layout table name no file"


def test_every_docs_script_takes_help_and_writes_nothing_for_it(tmp_path):
    """`python docs/example_cpu_seeds4/predict.py --help` ran the prediction and overwrote the committed
    design_prediction.json (with NaN, not strict JSON), and the example scripts that read sys.argv took `--help`
    for a folder and stopped with a traceback. Every script under docs/ now reads its arguments with argparse; the
    one that writes a committed file prints its usage for --help and writes nothing."""
    import ast
    import subprocess
    import sys

    scripts = sorted((ROOT / "docs").rglob("*.py"))
    assert scripts
    for path in scripts:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        if not any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body):
            continue  # a module imported by another script
        assert "ArgumentParser" in names, f"{path.relative_to(ROOT)} reads its arguments without argparse"
        assert "argv" not in names or "parse_args" in names, f"{path.relative_to(ROOT)} reads sys.argv itself"
    committed = ROOT / "docs" / "example_cpu_seeds4" / "design_prediction.json"
    before = committed.read_bytes()
    res = subprocess.run([sys.executable, str(committed.parent / "predict.py"), "--help"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0 and res.stdout.startswith("usage: predict.py"), res.stderr
    assert committed.read_bytes() == before
