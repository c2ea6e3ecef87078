"""No step without its figures: a commit reaches the service only after its steps' rows.

Before, the rows waited for the next report window (every 2 s) while the COMMITTED
registration went out at once; a crash in between resumed the next attempt from that
checkpoint, and the steps up to it never had a row (20 to 22 steps a run in a soak).
"""

from __future__ import annotations

from worker_helpers import FakeService

from worker.reporter import HttpReporter


def test_the_steps_of_a_commit_are_delivered_before_the_commit(fake_service: FakeService) -> None:
    # A window far longer than the test: only the commit itself can flush the rows.
    reporter = HttpReporter(fake_service.url, 7, node="n", interval_s=3600.0)
    for step in range(1, 21):
        reporter.metric(step, loss=4.0 - step / 100, tokens_per_s=1.0, step_time_s=0.1, lr=1e-3)
    reporter.checkpoint(20, "/ckpt/step_00000020", "COMMITTED", num_bytes=1, write_s=0.1)

    paths = [path.rsplit("/", 1)[-1] for path, _, _ in fake_service.received]
    assert "checkpoints" in paths, paths
    before_commit = fake_service.received[: paths.index("checkpoints")]
    delivered = [m["step"] for path, body, _ in before_commit for m in body.get("metrics", [])]
    print(f"requests in order: {paths}; steps delivered before the commit: {delivered}")
    assert delivered == list(range(1, 21))
    assert {m["lr"] for m in fake_service.bodies("/progress")[0]["metrics"]} == {1e-3}
    reporter.close(drain_timeout_s=0)


def test_a_writing_registration_does_not_wait_for_the_rows(fake_service: FakeService) -> None:
    """WRITING is informational and must not stall training: no flush for it."""
    reporter = HttpReporter(fake_service.url, 7, node="n", interval_s=3600.0)
    reporter.metric(1, loss=4.0, tokens_per_s=1.0, step_time_s=0.1)
    reporter.checkpoint(1, "/ckpt/step_00000001", "WRITING")
    assert [path.rsplit("/", 1)[-1] for path, _, _ in fake_service.received] == ["checkpoints"]
    reporter.close(drain_timeout_s=0)
