"""An ``--out`` folder where a file the commands write could match the corpus glob is refused before anything is
written, as one inside a directory corpus is (the run's own report.md used to become corpus text, and every rerun
was then refused for a changed corpus).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from tiny_spec import tiny_spec

from loopscale.sweep.spec import check_out_outside_corpus, parse_spec

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


@pytest.mark.parametrize(
    ("pattern", "out", "refused"),
    [
        ("proj/**/*.md", "proj/out", True),
        ("proj/**/*", "proj/out", True),
        ("proj/*", "proj", True),
        ("proj/*/*", "proj/out", True),
        ("proj/o*/**/*.txt", "proj/out/deeper", True),
        ("proj/*.md", "proj/out", False),  # one folder deeper than the glob reaches
        ("proj/docs/*.md", "proj/out", False),
        ("proj/**/*.md", "proj/.out", False),  # glob does not read hidden folders
        ("proj/**/*.md", "elsewhere", False),
    ],
)
def test_an_out_folder_a_corpus_glob_could_read_is_refused(tmp_path, pattern, out, refused):
    (tmp_path / "proj" / "docs").mkdir(parents=True)
    (tmp_path / "proj" / "docs" / "a.md").write_text(TEXT)
    (tmp_path / "proj" / "b.md").write_text(TEXT)
    (tmp_path / "proj" / "out").mkdir()
    (tmp_path / "proj" / "out" / "x.txt").write_text(TEXT)
    spec = parse_spec({"name": "t", "corpus": str(tmp_path / pattern), "sizes": [16], "tokens": [2048], "lr": {"fixed": 0.01}})
    if refused:
        with pytest.raises(ValueError, match="which the corpus glob .* searches"):
            check_out_outside_corpus(tmp_path / out, spec)
    else:
        check_out_outside_corpus(tmp_path / out, spec)


def test_run_and_its_dry_run_refuse_an_out_folder_the_corpus_glob_could_read(tmp_path):
    proj = tmp_path / "proj3"
    proj.mkdir()
    for i in range(3):
        (proj / f"doc{i}.md").write_text(TEXT * (i + 1))
    spec = tiny_spec(corpus="proj3/**/*.md")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    env = dict(os.environ, LOOPSCALE_CACHE=str(tmp_path / "cache"), RAY_TMPDIR="/tmp/lsray_t")
    for extra in (["--dry-run", "--json"], []):
        p = subprocess.run(
            [sys.executable, "-m", "loopscale.sweep.cli", "run", "s.yaml", "--out", "proj3/out", *extra],
            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
        )  # fmt: skip
        assert p.returncode == 2, (extra, p.stdout[-2000:], p.stderr[-2000:])
        assert "which the corpus glob" in p.stderr and "searches" in p.stderr, p.stderr[-2000:]
    assert sorted(x.name for x in proj.iterdir()) == ["doc0.md", "doc1.md", "doc2.md"]  # nothing written
