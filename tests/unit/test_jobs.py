"""The job book and runner: a 202 is a promise (resume after a restart or a shutdown), the queue's bound,
and retention by count and by age. No model, no store: jobs carry ids, the work is a fake."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.api.jobs import (
    RETRY_AFTER_MAX_S,
    RETRY_AFTER_MIN_S,
    UNMEASURED_DOCUMENTS_PER_S,
    Job,
    JobBook,
    JobInterrupted,
    JobRunner,
    QueueBound,
    QueueFull,
)

HOUR_S = 3600.0


def accepted(book: JobBook, ids: list[str], nbytes: int = 0) -> Job:
    return book.accept("ingest", ids, nbytes, len(ids), before=lambda: None)


def stamp(hours_ago: float) -> str:
    when = datetime.now(UTC) - timedelta(hours=hours_ago)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- resume ------------------------------------------------------------------------------------------------


def test_unfinished_jobs_with_their_ids_are_queued_again_at_the_next_start(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    running = accepted(book, ["a", "b"])
    book.update(running, state="running", startedAt="2026-01-01T00:00:00.000Z", embedded=1, stored=1)
    queued = accepted(book, ["c"])
    done = accepted(book, ["d"])
    book.update(done, state="done", report={"added": 1})

    again = JobBook(tmp_path)
    assert again.recover() == []  # nothing is interrupted: every unfinished job can be resumed
    assert [j.id for j in again.unfinished()] == [running.id, queued.id]
    for job in again.unfinished():
        on_disk = json.loads((tmp_path / f"{job.id}.json").read_text())
        assert (on_disk["state"], on_disk["resumed"], on_disk["startedAt"]) == ("queued", 1, None)
    resumed = again.get(running.id)
    assert resumed is not None
    assert (resumed.createdAt, resumed.documentIds, resumed.stored) == (running.createdAt, ["a", "b"], 1)
    assert again.get(done.id).state == "done"  # type: ignore[union-attr]

    third = JobBook(tmp_path)  # a second restart before it ran: counted again
    third.recover()
    assert third.get(running.id).resumed == 2  # type: ignore[union-attr]


def test_a_record_of_the_older_shape_is_still_reported_interrupted(tmp_path: Path) -> None:
    old = {
        "id": "j-20260101T000000-0123abcd",
        "kind": "ingest",
        "state": "queued",
        "createdAt": "2026-01-01T00:00:00.000Z",
        "documents": 5,
        "chunks": 80,
    }
    (tmp_path / f"{old['id']}.json").write_text(json.dumps(old))
    book = JobBook(tmp_path)
    interrupted = book.recover()
    assert [j.id for j in interrupted] == [old["id"]]
    assert book.unfinished() == []
    assert "nothing of it was written" in (interrupted[0].error or "")


def test_a_job_stopped_by_the_shutdown_goes_back_to_queued_and_the_rest_stay_queued(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    runner = JobRunner(book)
    stopped, later = accepted(book, ["a"]), accepted(book, ["b"])
    ran = threading.Event()

    def shut_down(job: Job) -> dict[str, int]:
        ran.set()
        raise JobInterrupted("the server shut down")

    runner.submit(stopped, shut_down)
    runner.submit(later, shut_down)
    assert ran.wait(5)
    assert runner.stop(timeout=5)
    assert (stopped.state, stopped.startedAt, stopped.finishedAt) == ("queued", None, None)
    assert later.state == "queued"
    again = JobBook(tmp_path)
    again.recover()
    assert [j.id for j in again.unfinished()] == [stopped.id, later.id]

    runner = JobRunner(again)
    finished = threading.Event()

    def works(job: Job) -> dict[str, int]:
        if job.id == later.id:
            finished.set()
        return {"added": 1}

    for job in again.unfinished():
        runner.submit(job, works)
    assert finished.wait(5)
    assert runner.stop(timeout=5)
    assert [(j.state, j.resumed) for j in again.all()] == [("done", 1), ("done", 1)]


def run_until_ended(book: JobBook, job: Job, work) -> None:  # type: ignore[no-untyped-def]
    runner = JobRunner(book)
    ended = threading.Event()
    runner.after_jobs = ended.set
    runner.submit(job, work)
    assert ended.wait(5)
    assert runner.stop(timeout=5)


def fails(job: Job) -> dict[str, int]:
    raise OSError(28, "No space left on device")


def test_a_failed_job_is_queued_again_at_each_start_until_it_has_failed_job_attempts_times(
    tmp_path: Path,
) -> None:
    book = JobBook(tmp_path, attempts=2)
    job = accepted(book, ["a"])
    run_until_ended(book, job, fails)
    assert (job.state, job.error) == ("failed", "OSError: [Errno 28] No space left on device")
    assert [f["error"] for f in job.failures] == ["OSError: [Errno 28] No space left on device"]

    again = JobBook(tmp_path, attempts=2)
    again.recover()
    retried = again.get(job.id)
    assert retried is not None
    assert [j.id for j in again.unfinished()] == [job.id]
    assert (retried.state, retried.error, retried.finishedAt, retried.resumed) == ("queued", None, None, 1)
    run_until_ended(again, retried, fails)
    assert len(retried.failures) == 2

    third = JobBook(tmp_path, attempts=2)
    third.recover()
    assert third.unfinished() == []  # failed twice: no third run
    kept = third.get(job.id)
    assert kept is not None and kept.state == "failed"
    assert [f["error"] for f in kept.failures] == ["OSError: [Errno 28] No space left on device"] * 2
    assert all(f["at"].endswith("Z") for f in kept.failures)


def test_a_failed_job_retried_at_the_next_start_can_end_done(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    job = accepted(book, ["a"])
    run_until_ended(book, job, fails)
    again = JobBook(tmp_path)
    again.recover()
    retried = again.get(job.id)
    assert retried is not None
    run_until_ended(again, retried, lambda job: {"added": 1})
    assert (retried.state, retried.error, retried.report) == ("done", None, {"added": 1})
    assert len(retried.failures) == 1  # the failure stays on the job


def test_a_job_file_that_cannot_be_read_is_an_unreadable_job_of_the_id_in_its_name(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    job = accepted(book, ["a", "b"])
    path = tmp_path / f"{job.id}.json"
    damaged = path.read_text()[:25]  # cut short
    path.write_text(damaged)
    (tmp_path / "j-not-an-id.json").write_text("{")
    again = JobBook(tmp_path)
    assert again.recover() == []
    found = again.get(job.id)
    assert found is not None
    assert (found.state, found.documentIds, found.createdAt[:16]) == ("unreadable", None, job.createdAt[:16])
    assert (found.error or "").startswith(f"the job's record {job.id}.json could not be read")
    assert "the start-up reconciliation indexes every recorded document" in (found.error or "")
    assert again.unfinished() == []
    assert path.read_text() == damaged  # left as it was, to look at
    assert [j.id for j in again.all()] == [job.id]


def test_an_unreadable_job_is_pruned_by_age_as_any_finished_job(tmp_path: Path) -> None:
    old = tmp_path / "j-20200101T000000-0123abcd.json"
    old.write_text("not json")
    now = [datetime(2020, 1, 1, 0, 30, tzinfo=UTC).timestamp()]
    book = JobBook(tmp_path, keep=1, keep_hours=1.0, clock=lambda: now[0])
    book.recover()
    assert book.get("j-20200101T000000-0123abcd") is not None
    book.update(accepted(book, ["a"]), state="done")
    now[0] += HOUR_S
    book.update(accepted(book, ["b"]), state="done")
    assert book.get("j-20200101T000000-0123abcd") is None and not old.exists()


def test_the_worker_reconciles_after_the_jobs_once_none_waits(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    runner = JobRunner(book)
    calls: list[list[str]] = []
    runner.after_jobs = lambda: calls.append([j.state for j in book.all()])
    gate = threading.Event()

    def waits(job: Job) -> dict[str, int]:
        assert gate.wait(5)
        return {}

    first, second, third = accepted(book, ["a"]), accepted(book, ["b"]), accepted(book, ["c"])
    runner.submit(first, waits)
    runner.submit(second, fails)
    runner.submit(third, waits)
    gate.set()
    deadline = time.monotonic() + 5
    while not calls:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert runner.stop(timeout=5)
    assert calls == [["done", "failed", "done"]]  # once, after the last


def test_what_the_reconciliation_raises_does_not_stop_the_worker(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    runner = JobRunner(book)

    def broken() -> None:
        raise RuntimeError("the store went away")

    runner.after_jobs = broken
    first = accepted(book, ["a"])
    runner.submit(first, lambda job: {})
    deadline = time.monotonic() + 5
    while first.state != "done":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = accepted(book, ["b"])
    runner.submit(second, lambda job: {})
    while second.state != "done":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert runner.stop(timeout=5)


def test_a_record_write_that_fails_midway_takes_the_job_away_and_has_the_kept_documents_reconciled(
    tmp_path: Path,
) -> None:
    book = JobBook(tmp_path)
    runner = JobRunner(book)
    book.kept_without_job = runner.reconcile_soon
    reconciled = threading.Event()
    runner.after_jobs = reconciled.set
    kept: list[str] = []

    def first_then_full_disk() -> None:
        kept.append("a")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left on device"):
        book.accept("ingest", ["a", "b"], 0, 2, before=first_then_full_disk)
    assert kept == ["a"]
    assert list(tmp_path.glob("j-*.json")) == [] and book.all() == []
    assert reconciled.wait(5)
    assert runner.stop(timeout=5)


# -- the bound ---------------------------------------------------------------------------------------------


def test_a_job_that_would_pass_the_document_bound_is_refused_before_anything_is_kept(tmp_path: Path) -> None:
    book = JobBook(tmp_path, bound=QueueBound(documents=10, bytes=10**9))
    accepted(book, [f"a{i}" for i in range(6)])
    accepted(book, [f"b{i}" for i in range(4)])  # exactly at the bound
    kept: list[str] = []
    with pytest.raises(QueueFull) as refused:
        book.accept("ingest", ["c0"], 0, 1, before=lambda: kept.append("c0"))
    assert kept == []
    assert len(list(tmp_path.glob("j-*.json"))) == 2
    message = str(refused.value)
    assert "rag.server.max_queued_documents=10" in message
    assert "holds 2 jobs (10 documents, 0 bytes)" in message
    # no job has finished yet: one document over, at the assumed pace
    assert refused.value.retry_after == max(RETRY_AFTER_MIN_S, int(1 / UNMEASURED_DOCUMENTS_PER_S + 0.999))


def test_a_job_that_would_pass_the_byte_bound_is_refused(tmp_path: Path) -> None:
    book = JobBook(tmp_path, bound=QueueBound(documents=1000, bytes=5000))
    accepted(book, ["a"], nbytes=4000)
    with pytest.raises(QueueFull, match=r"1001 more bytes would pass rag.server.max_queued_bytes=5000"):
        accepted(book, ["b"], nbytes=1001)
    accepted(book, ["b"], nbytes=1000)


def test_one_write_larger_than_the_bound_is_accepted_into_an_empty_queue(tmp_path: Path) -> None:
    book = JobBook(tmp_path, bound=QueueBound(documents=2, bytes=1024))
    job = accepted(book, ["a", "b", "c"], nbytes=4096)
    assert job.documentIds == ["a", "b", "c"] and job.bytes == 4096
    with pytest.raises(QueueFull):
        accepted(book, ["d"])


def test_finished_jobs_make_room_and_resumed_ones_count(tmp_path: Path) -> None:
    book = JobBook(tmp_path, bound=QueueBound(documents=3, bytes=10**9))
    first = accepted(book, ["a", "b", "c"])
    with pytest.raises(QueueFull):
        accepted(book, ["d"])
    book.update(first, state="done")
    accepted(book, ["d", "e"])

    again = JobBook(tmp_path, bound=QueueBound(documents=3, bytes=10**9))
    again.recover()  # the queued job of two documents is resumed: it counts toward the bound
    with pytest.raises(QueueFull, match="holds 1 jobs"):
        accepted(again, ["f", "g"])
    accepted(again, ["f"])


def test_retry_after_follows_the_measured_pace_within_its_limits(tmp_path: Path) -> None:
    book = JobBook(tmp_path, bound=QueueBound(documents=10, bytes=10**9))
    done = accepted(book, [f"x{i}" for i in range(4)])
    book.update(done, state="done")
    book.finished_in(done, seconds=2.0)  # 2 documents a second
    experiment = book.create("experiment", 0, 0)
    book.finished_in(experiment, seconds=600.0)  # no documents: says nothing of the write pace
    accepted(book, [f"a{i}" for i in range(10)])
    with pytest.raises(QueueFull) as refused:
        accepted(book, [f"b{i}" for i in range(7)])
    assert refused.value.retry_after == 7 // 2 + 1  # ceil(7 / 2)

    slow = JobBook(tmp_path / "slow", bound=QueueBound(documents=1, bytes=10**9))
    crawl = accepted(slow, ["a"])
    slow.update(crawl, state="done")
    slow.finished_in(crawl, seconds=10_000.0)
    accepted(slow, ["a"])
    with pytest.raises(QueueFull) as refused:
        accepted(slow, ["b"])
    assert refused.value.retry_after == RETRY_AFTER_MAX_S


# -- retention ---------------------------------------------------------------------------------------------


def test_a_finished_job_accepted_within_keep_hours_is_kept_beyond_keep(tmp_path: Path) -> None:
    book = JobBook(tmp_path, keep=2, keep_hours=24.0)
    recent = []
    for _ in range(5):
        job = accepted(book, ["a"])
        book.update(job, state="done")
        recent.append(job)
    waiting = accepted(book, ["b"])  # creating prunes
    assert all(book.get(j.id) is not None for j in recent)
    assert len(list(tmp_path.glob("j-*.json"))) == 6
    # the list shows the unfinished jobs and the newest `keep` finished ones; the others are found by id
    assert [j.id for j in book.listed()] == [waiting.id, recent[-1].id, recent[-2].id]


def test_a_finished_job_is_pruned_only_when_beyond_keep_and_older_than_keep_hours(tmp_path: Path) -> None:
    book = JobBook(tmp_path, keep=2, keep_hours=24.0)
    ages = [50.0, 30.0, 25.0, 23.0, 1.0]  # hours since accepted, oldest first
    jobs = []
    for age in ages:
        job = accepted(book, ["a"])
        book.update(job, state="done", createdAt=stamp(age))
        jobs.append(job)
    unfinished_old = accepted(book, ["b"])
    book.update(unfinished_old, createdAt=stamp(100.0))
    book.create("ingest", 1, 1)  # creating prunes
    # beyond the newest 2 finished: the 50, 30, 25 and 23 h old ones; of those, older than 24 h: 3
    assert [book.get(j.id) is not None for j in jobs] == [False, False, False, True, True]
    assert book.get(unfinished_old.id) is not None  # unfinished jobs are never pruned
    assert sorted(p.stem for p in tmp_path.glob("j-*.json")) == sorted(j.id for j in book.all())

    again = JobBook(tmp_path, keep=2, keep_hours=24.0)
    again.recover()
    assert again.get(jobs[3].id) is not None  # a restart keeps what the period keeps


def test_retention_reads_the_clock_it_is_given(tmp_path: Path) -> None:
    now = [time.time()]
    book = JobBook(tmp_path, keep=1, keep_hours=1.0, clock=lambda: now[0])
    first = accepted(book, ["a"])
    book.update(first, state="done")
    second = accepted(book, ["b"])
    book.update(second, state="done")
    accepted(book, ["c"])
    assert book.get(first.id) is not None
    now[0] += 1.01 * HOUR_S
    accepted(book, ["d"])
    assert book.get(first.id) is None and book.get(second.id) is not None


def test_the_list_view_leaves_out_the_document_ids(tmp_path: Path) -> None:
    job = accepted(JobBook(tmp_path), ["a", "b"], nbytes=12)
    assert job.view()["documentIds"] == ["a", "b"]
    listed = job.view(with_ids=False)
    assert "documentIds" not in listed
    assert (listed["documents"], listed["bytes"], listed["resumed"]) == (2, 12, 0)


def test_an_experiment_running_at_a_stop_is_interrupted_saying_to_run_it_again(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    job = book.create("experiment", 0, 0)
    book.update(job, state="running")
    again = JobBook(tmp_path)
    (interrupted,) = again.recover()
    assert (interrupted.id, interrupted.state) == (job.id, "interrupted")
    assert interrupted.error is not None and "Run it again" in interrupted.error
    assert again.unfinished() == []  # never resumed: it is run again by asking
