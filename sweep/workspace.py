"""Trial-side helpers shared by the grid and the LR trainables: a run's checkpoint workspace and what a trial
reports to Tune.

Every run has a ``run_id`` (``loopscale.sweep.spec.run_id``); its trainer checkpoints live under
``<storage>/checkpoints/<run_id>/`` and the trainer resumes from the newest one there. After a hard kill of the
driver Tune's experiment snapshot can lag the disk (restored trials restarted from an older checkpoint, or from step
0; ``docs/ray_tune.md`` §2), so a restarted trial always looks there first; Tune's own checkpoint
(``tune.get_checkpoint()``) is copied in only when it is newer than anything on disk. A finished run writes
``<storage>/checkpoints/<run_id>/result.json``; a trial whose run already finished reports that result instead of
training again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from loopscale.cluster import storage

DONE_KEY = "run_done"
"""Set (True) in the single report that carries the finished ``RunResult``."""


RESULT = "result.json"
"""The file a finished run writes in its :func:`run_uri` (its ``RunResult.to_dict()``)."""


def run_uri(storage_uri: str, rid: str) -> str:
    """``<storage>/checkpoints/<run id>``: where run ``rid`` keeps its checkpoints and its finished :data:`RESULT`."""
    return storage.join(storage_uri, "checkpoints", rid)


def _ckpt_files(d: Path) -> list[Path]:
    if not d.is_dir():
        return []
    return [
        p
        for p in d.iterdir()
        if p.is_file() and p.name != RESULT and not p.name.startswith(".")
    ]


def stored_result_ids(storage_uri: str, run_ids) -> set[str]:
    """Those of ``run_ids`` whose finished ``result.json`` lies in a local storage (``<storage>/checkpoints/<run
    id>/``): runs that finished while no driver was there to record them, which the next sweep records without
    training. Only checks that the files exist, creating nothing; a remote storage is not read (empty set)."""
    if not storage.is_local_uri(storage_uri):
        return set()

    def stored(rid: str) -> bool:
        return Path(storage.local_path(storage.join(run_uri(storage_uri, rid), RESULT))).is_file()

    return {rid for rid in run_ids if stored(rid)}


class RunWorkspace:
    """Where one run keeps its trainer checkpoints (a local directory) and its finished result.

    ``uri`` = ``<storage>/checkpoints/<run_id>``. For a local storage the trainer writes there directly; for
    a remote one it writes to a local cache that is fetched at start and synced after every checkpoint.
    """

    def __init__(self, storage_uri: str, rid: str):
        self.rid = rid
        self.uri = run_uri(storage_uri, rid)
        self.local = storage.is_local_uri(storage_uri)
        if self.local:
            self.dir = storage.local_path(self.uri)
        else:
            self.dir = Path(tempfile.gettempdir()) / "loopscale_ckpt" / rid
        self.dir.mkdir(parents=True, exist_ok=True)

    def pull(self) -> None:
        """Remote storage: copy the stored checkpoint directory into the local cache (no-op when local)."""
        if self.local:
            return
        try:
            storage.fetch_dir(storage.join(self.uri, "trainer"), str(self.dir))
        except FileNotFoundError:
            pass

    def push(self) -> None:
        """Remote storage: upload the local checkpoint directory (no-op when local)."""
        if self.local:
            return
        storage.sync_dir(str(self.dir), storage.join(self.uri, "trainer"))

    def adopt(self, ckpt_dir: str) -> bool:
        """Copy checkpoint files from a Tune checkpoint directory when they are newer than the local ones
        (by file modification time); returns True when something was copied."""
        src = [p for p in Path(ckpt_dir).iterdir() if p.is_file()]
        if not src:
            return False
        newest_local = max((p.stat().st_mtime for p in _ckpt_files(self.dir)), default=-1.0)
        if max(p.stat().st_mtime for p in src) <= newest_local:
            return False
        for p in src:
            dst = self.dir / p.name
            if not dst.exists():
                shutil.copy2(p, dst)
        return True

    def prepare_resume(self) -> None:
        """Inside a Tune trial, before training: bring this run's checkpoints into :attr:`dir` — the stored ones
        (:meth:`pull`) and Tune's restored checkpoint when it is newer (:meth:`adopt`) — so the trainer resumes
        from the newest of them (Tune's snapshot can lag the files on disk after a hard kill)."""
        from ray import tune

        self.pull()
        ckpt = tune.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                self.adopt(d)

    def result(self) -> dict | None:
        """The finished ``RunResult.to_dict()`` of this run, if it finished before."""
        return storage.read_json_uri(storage.join(self.uri, RESULT))

    def save_result(self, result: dict) -> None:
        storage.write_json_uri(storage.join(self.uri, RESULT), result)

    def move_to(self, dest: str) -> bool:
        """Move everything this run stored (its checkpoints, its ``result.json``) to ``dest`` (``--force``: nothing
        written is deleted); ``dest`` is a local path for a local storage, else a URI of the same storage. A remote
        storage's local cache (a copy) is dropped. Returns False when the run had stored nothing."""
        import pyarrow.fs as pafs

        if self.local:
            if not self.dir.is_dir() or not any(self.dir.iterdir()):
                if self.dir.is_dir():
                    self.dir.rmdir()
                return False
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.dir), dest)
            return True
        shutil.rmtree(self.dir, ignore_errors=True)
        fs, path = storage.resolve_uri(self.uri)
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return False
        _, to = storage.resolve_uri(dest)
        try:
            fs.move(path, to)
        except (OSError, NotImplementedError):  # object stores move no directory: copy, then delete the original
            pafs.copy_files(path, to, source_filesystem=fs, destination_filesystem=fs)
            fs.delete_dir(path)
        return True


def event_metrics(event: dict) -> dict:
    """Tune metrics of one trainer event (None values dropped: Tune's CSV logger cannot hold them).

    ``start_tokens`` (tokens per member trained before this attempt: a resumed run's checkpoint) and ``attempt_s``
    (seconds since the attempt's first step) let a progress display measure the first rate of a trial from where
    and when it started training, not from zero and not from the trial's start-up."""
    keys = ("step", "tokens", "train_loss", "val_loss", "lr", "start_tokens", "attempt_s")
    out = {k: event.get(k) for k in keys}
    out = {k: (float(v) if isinstance(v, float) else v) for k, v in out.items() if v is not None}
    out[DONE_KEY] = False
    return out


def tune_checkpoint_from(path: str | None):
    """A ``tune.Checkpoint`` holding the trainer checkpoint at ``path`` (a file or a directory), staged in a
    temporary directory next to it (Tune copies it into its storage), or None. Returns (checkpoint, tmpdir)."""
    if not path:
        return None, None
    from ray import tune

    p = Path(path)
    stage = Path(tempfile.mkdtemp(prefix=".tune_stage_", dir=str(p.parent)))
    if p.is_dir():
        shutil.copytree(p, stage, dirs_exist_ok=True)
    else:
        try:
            os.link(p, stage / p.name)
        except OSError:
            shutil.copy2(p, stage / p.name)
    return tune.Checkpoint.from_directory(str(stage)), stage
