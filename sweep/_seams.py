"""Test seams of the Tune trainables (private: not part of the sweep spec, the CLI or the package's API).

The tests switch them on with environment variables of the *driver* process; the driver reads them once
(:func:`from_env`) and passes them to every trial in its config under :data:`CONFIG_KEY`, so they reach trials on
any node without depending on how Ray starts worker processes. Unset, nothing here does anything.

* ``LOOPSCALE_TEST_FAULT_AT_STEP=<k>``: a trial raises ``RuntimeError`` once per run id at its first trainer event
  with step >= k (the checkpoint of that step is already written), to exercise Tune's retry-from-checkpoint;
  ``<k>:always`` raises at every attempt (a trial that errors past ``max_failures``).
* ``LOOPSCALE_TEST_COUNT_TRAININGS=1``: the LR trainable leaves one marker per completed training of a run id under
  ``<storage>/trained/`` (read back with :func:`trained_counts`), so a test can prove no LR is trained twice.
"""

from __future__ import annotations

import os
import uuid

FAULT_ENV = "LOOPSCALE_TEST_FAULT_AT_STEP"
COUNT_ENV = "LOOPSCALE_TEST_COUNT_TRAININGS"
CONFIG_KEY = "_test_seams"
"""Key of the seams in a trial's config (None when no seam is on)."""


def from_env() -> dict | None:
    """The seams switched on in this (driver) process, or None.

    Raises:
        ValueError: a malformed ``LOOPSCALE_TEST_FAULT_AT_STEP``.
    """
    fault = os.environ.get(FAULT_ENV, "").strip()
    count = os.environ.get(COUNT_ENV, "").strip() == "1"
    if not fault and not count:
        return None
    at, _, mode = fault.partition(":")
    if fault and (not at.isdigit() or int(at) < 1 or mode not in ("", "always")):
        raise ValueError(f"{FAULT_ENV} must be '<step>' or '<step>:always' with step >= 1, got {fault!r}")
    return {
        "fault_at_step": int(at) if fault else None,
        "fault_always": mode == "always",
        "count_trainings": count,
    }


def maybe_fail(seams: dict | None, storage_uri: str, rid: str, step: int) -> None:
    """Raise the injected failure when the fault seam is on and ``step`` reached it (once per run id unless
    ``always``; the marker ``<storage>/faults/<run_id>`` records that it fired).

    Raises:
        RuntimeError: the injected failure.
    """
    at = (seams or {}).get("fault_at_step")
    if at is None or step < at:
        return
    from loopscale.cluster import storage

    marker = storage.join(storage_uri, "faults", rid)
    if not seams.get("fault_always"):
        if storage.exists(marker):
            return
        storage.write_bytes_atomic(marker, str(step).encode())
    raise RuntimeError(f"injected failure at step {step} ({FAULT_ENV}={at}, run {rid})")


def mark_trained(seams: dict | None, storage_uri: str, rid: str) -> None:
    """Leave one marker for a completed training of run ``rid`` (only when the counting seam is on)."""
    if not (seams or {}).get("count_trainings"):
        return
    from loopscale.cluster import storage

    storage.write_bytes_atomic(storage.join(storage_uri, "trained", f"{rid}-{uuid.uuid4().hex[:8]}"), b"1")


def trained_counts(storage_uri: str) -> dict[str, int]:
    """{run id: completed trainings} from the markers of :func:`mark_trained`."""
    from loopscale.cluster import storage

    d = storage.join(storage_uri, "trained")
    if not storage.exists(d):
        return {}
    out: dict[str, int] = {}
    for name in storage.listdir(d):
        rid = os.path.basename(name).rsplit("-", 1)[0]
        out[rid] = out.get(rid, 0) + 1
    return out
