"""The reconciliation in a running service, around a fake Sieve: `/ready` names recorded documents a pass
left unindexed until a later pass indexes them, a pass that cannot compare is said the same way, the job
worker reconciles after the jobs, and a job whose file cannot be read is answered `unreadable`, not 404."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.jobs import JobBook
from app.api.reconcile import PHASE, reconcile_after_jobs, reconcile_index
from app.ingest.check import compare
from app.ingest.reconcile import ReconcilePlan, ReconcileReport
from app.ingest.types import Document
from app.main import AppState, create_app
from app.settings import Settings
from tests.fixtures.fake_api import ADMIN_TOKEN, FakeSieve, api_settings  # noqa: F401

WAIT_S = 10.0


def report(to_index: list[str], indexed: list[str], error: str | None = None) -> ReconcileReport:
    expected = {d: frozenset({f"c_{d}"}) for d in to_index}
    plan = ReconcilePlan(True, len(to_index), compare(expected, {}), {d: "h" for d in to_index})
    return ReconcileReport(plan, indexed=indexed, error=error)


class ReconcilingSieve(FakeSieve):
    """Answers each `reconcile` with the next of `outcomes` (a report, or an exception to raise)."""

    def __init__(self, settings: Settings, outcomes: list[ReconcileReport | Exception]) -> None:
        super().__init__(settings)
        self.outcomes = outcomes
        self.passes: list[bool] = []
        self.pending = True

    def reconcile_pending(self) -> bool:
        return self.pending

    def reconcile(
        self,
        full: bool = False,
        should_stop: Callable[[], bool] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> ReconcileReport:
        self.passes.append(full)
        if on_progress is not None:
            on_progress(0, 4)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def serve(fake: FakeSieve, start_more: Callable[[AppState], None] = lambda state: None) -> TestClient:
    def start(state: AppState) -> None:
        state.sieve = fake
        start_more(state)
        state.phase = "ready"
        state.ready = True

    return TestClient(
        create_app(fake.settings, start=start), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )


def ready_body(client: TestClient) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while (answer := client.get("/ready")).status_code != 200:
        assert time.monotonic() < deadline, answer.json()
        time.sleep(0.01)
    return dict(answer.json())


def test_ready_names_the_documents_a_pass_left_unindexed_until_a_later_pass_indexes_them(
    settings: Settings,
) -> None:
    full_disk = "OSError: [Errno 28] No space left on device"
    fake = ReconcilingSieve(settings, [report(["a", "b"], ["a"], full_disk), report(["b"], ["b"])])
    phases: list[str] = []

    def start(state: AppState) -> None:
        reconcile_index(state, fake, full=True)  # type: ignore[arg-type]
        phases.append(state.phase)

    with serve(fake, start) as client:
        body = ready_body(client)
        assert body == {
            "status": "ready",
            "unindexed": "1 document of the document record not indexed, so not served (b): "
            f"{full_disk}; the service tries again after write jobs, at each start and every few "
            "minutes (`sieve store check` lists them)",
        }
        state: AppState = client.app.state.sieve_state  # type: ignore[attr-defined]
        reconcile_after_jobs(state, fake)  # type: ignore[arg-type]
        assert ready_body(client) == {"status": "ready"}
    assert fake.passes == [True, False]
    assert phases == [f"{PHASE}: indexing documents 0/4"]


def test_a_pass_that_cannot_compare_is_said_by_ready(settings: Settings) -> None:
    fake = ReconcilingSieve(settings, [RuntimeError("the record cannot be read")])
    with serve(fake, lambda state: reconcile_index(state, fake, full=True)) as client:  # type: ignore[arg-type]
        body = ready_body(client)
    assert body["status"] == "ready"
    assert body["unindexed"].startswith(
        "the index could not be compared with the document record (RuntimeError: the record cannot be "
        "read), so recorded documents may not be served"
    )


def test_a_pass_after_the_jobs_is_skipped_once_the_server_stops(settings: Settings) -> None:
    fake = ReconcilingSieve(settings, [])
    state = AppState(settings=settings)
    state.stopping.set()
    reconcile_after_jobs(state, fake)  # type: ignore[arg-type]
    assert fake.passes == []


def test_no_pass_and_no_write_lock_after_jobs_that_indexed_everything_themselves(settings: Settings) -> None:
    fake = ReconcilingSieve(settings, [])
    fake.pending = False
    state = AppState(settings=settings)
    state.unindexed = "2 documents of the document record not indexed, ..."  # since written again
    with state.write_lock:  # a write runs: the pass must not wait for it
        reconcile_after_jobs(state, fake)  # type: ignore[arg-type]
    assert (fake.passes, state.unindexed) == ([], None)


def test_a_job_whose_file_cannot_be_read_is_answered_unreadable_not_404(settings: Settings) -> None:
    jobs_dir = Path(settings.rag.server.jobs_dir)
    book = JobBook(jobs_dir)
    job = book.accept("ingest", ["a", "b", "c", "d"], 40, 4, before=lambda: None)
    (jobs_dir / f"{job.id}.json").write_bytes(b"\x00" * 16)  # a torn write
    with serve(FakeSieve(settings)) as client:
        ready_body(client)
        answer = client.get(f"/api/jobs/{job.id}")
        listed = client.get("/api/jobs").json()["jobs"]
    assert answer.status_code == 200, answer.text
    view = answer.json()
    assert (view["id"], view["state"], view["createdAt"][:16]) == (job.id, "unreadable", job.createdAt[:16])
    assert view["error"].startswith(f"the job's record {job.id}.json could not be read at the last start")
    assert [j["state"] for j in listed] == ["unreadable"]


def test_a_job_write_that_fails_once_some_documents_are_kept_is_reconciled_by_the_worker(
    settings: Settings,
) -> None:
    fake = FakeSieve(settings.model_copy(deep=True))
    fake.settings.rag.server.sync_write_chunks = 1  # every write is a job
    reconciled: list[str] = []

    def start(state: AppState) -> None:
        state.job_runner.after_jobs = lambda: reconciled.append("pass")
        keep = state.jobs.held.put

        def first_then_full_disk(documents: Sequence[Document]) -> int:
            keep(documents[:1])
            raise OSError(28, "No space left on device")

        state.jobs.held.put = first_then_full_disk  # type: ignore[method-assign]

    with serve(fake, start) as client:
        ready_body(client)
        documents = [{"id": i, "title": i, "text": f"text of {i}"} for i in ("a", "b")]
        answer = client.post("/api/documents", json={"documents": documents})
        assert answer.status_code == 507
        deadline = time.monotonic() + WAIT_S
        while not reconciled:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert reconciled == ["pass"]


def test_documents_left_unindexed_are_tried_again_later_each_time_twice_as_late(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.api.reconcile as reconcile

    monkeypatch.setattr(reconcile, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(reconcile, "RETRY_MAX_S", 0.1)
    full_disk = "OSError: [Errno 28] No space left on device"
    outcomes: list[ReconcileReport | Exception] = [report(["a"], [], full_disk) for _ in range(3)]
    fake = ReconcilingSieve(settings, [*outcomes, report(["a"], ["a"])])
    state = AppState(settings=settings)
    state.job_runner.after_jobs = lambda: reconcile_after_jobs(state, fake)  # type: ignore[arg-type]
    delays: list[float] = []

    reconcile_index(state, fake, full=True)  # type: ignore[arg-type]
    deadline = time.monotonic() + WAIT_S
    while state.unindexed is not None:
        if state.reconcile_retry_s and (not delays or delays[-1] != state.reconcile_retry_s):
            delays.append(state.reconcile_retry_s)
        assert time.monotonic() < deadline, state.unindexed
        time.sleep(0.005)
    assert state.job_runner.stop(timeout=5)
    assert fake.passes == [True, False, False, False]  # three tries by the worker, the last indexed it
    assert delays == [0.05, 0.1]  # doubled, then held at the most
    assert state.reconcile_retry_s == 0.0


class FailingWrites(FakeSieve):
    def ingest_documents(self, documents: list[Any], **_: Any) -> Any:
        raise OSError(28, "No space left on device")


def test_a_write_done_at_once_that_fails_is_reconciled_by_the_worker(settings: Settings) -> None:
    fake = FailingWrites(settings)
    reconciled: list[str] = []

    def start(state: AppState) -> None:
        state.job_runner.after_jobs = lambda: reconciled.append("pass")

    with serve(fake, start) as client:
        ready_body(client)
        answer = client.post("/api/documents", json={"documents": [{"id": "a", "title": "a", "text": "a"}]})
        assert answer.status_code >= 500  # one chunk: written at once, and failed
        deadline = time.monotonic() + WAIT_S
        while not reconciled:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert reconciled == ["pass"]
