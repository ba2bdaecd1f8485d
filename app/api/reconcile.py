"""The index catches up with the document record, in a running service: at start-up (a full pass, before
the startup evaluation and the resumed jobs, `/ready` saying how far it got) and after the write jobs (an
incremental pass, once no other job waits, in the job worker). The passes themselves are the Sieve's
(`Sieve.reconcile`, app/ingest/reconcile.py).

A pass that leaves recorded documents unindexed (a store failure, a full disk) says so in the log and in
`/ready` (`unindexed`) until a later pass indexes them: every pass looks at them again, and while some are
left the job worker makes one on its own, after `RETRY_FIRST_S`, then twice as long each time up to
`RETRY_MAX_S` (each try embeds them again, so a long outage is not a busy loop).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from app.models import EmbeddingInterrupted

if TYPE_CHECKING:
    from app.api.state import AppState
    from app.service import Sieve

log = logging.getLogger(__name__)

PHASE = "reconciling the index with the document record"
RETRY_FIRST_S = 30.0
RETRY_MAX_S = 600.0


def reconcile_index(state: AppState, sieve: Sieve, full: bool) -> None:
    """One pass under the write lock (`full` at start-up, where it also shows in `/ready`'s phase); what it
    leaves unindexed goes to `state.unindexed`. A pass that cannot even compare (the store or the record
    cannot be read) is said the same way; a shutdown stops it as it stops an ingest (`EmbeddingInterrupted`,
    raised)."""

    def progress(done: int, total: int) -> None:
        if full:
            state.phase = f"{PHASE}: indexing documents {done}/{total}"

    if full:
        state.phase = PHASE
    with state.write_lock:
        try:
            report = sieve.reconcile(full, should_stop=state.stopping.is_set, on_progress=progress)
        except EmbeddingInterrupted:
            raise
        except Exception as exc:  # the comparison itself failed: say it, serve what the index holds
            state.unindexed = (
                f"the index could not be compared with the document record ({type(exc).__name__}: {exc}), "
                "so recorded documents may not be served; the service tries again after write jobs, at "
                "each start and every few minutes (`sieve store check` tells what is missing)"
            )
            log.error("reconcile: %s", state.unindexed)
        else:
            state.unindexed = report.note if report is not None else None
    if state.unindexed:
        _try_again_later(state)
    else:
        state.reconcile_retry_s = 0.0


def _try_again_later(state: AppState) -> None:
    """Have the job worker make a pass after the next delay (`RETRY_FIRST_S`, doubling to `RETRY_MAX_S`),
    unless one is already scheduled or the server stops."""
    if state.stopping.is_set() or (state.reconcile_timer is not None and state.reconcile_timer.is_alive()):
        return
    delay = min(RETRY_MAX_S, state.reconcile_retry_s * 2 or RETRY_FIRST_S)
    state.reconcile_retry_s = delay

    def fire() -> None:
        state.reconcile_timer = None  # before the pass it asks for, which may schedule the next
        if not state.stopping.is_set():
            state.job_runner.reconcile_soon()

    state.reconcile_timer = threading.Timer(delay, fire)
    state.reconcile_timer.daemon = True
    state.reconcile_timer.start()
    log.info("reconcile: the documents left unindexed are tried again in %.0fs", delay)


def reconcile_after_jobs(state: AppState, sieve: Sieve) -> None:
    """The job worker's pass after the jobs (`JobRunner.after_jobs`): incremental, and only when the record
    changed other than through the jobs' own ingests (asked without the write lock, so a write that follows
    a job is not answered 202 for it); a shutdown ends it quietly (the next start makes a full pass)."""
    if state.stopping.is_set():
        return
    if not sieve.reconcile_pending():  # every recorded document indexed, by the jobs or a pass before
        state.unindexed = None
        return
    try:
        reconcile_index(state, sieve, full=False)
    except EmbeddingInterrupted:
        log.info("reconcile: stopped by the shutdown; the next start reconciles the index")
