"""The reporter against a stand-in service over real HTTP: order, outages, bounds."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from runyard_client import http_reporter
from worker_helpers import FakeService, free_port, tiny_spec

from worker.errors import DoNotRetryError
from worker.reporter import HttpReporter, fetch_config, post_error


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll a condition the background thread makes true (it has no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def steps_received(service: FakeService) -> list[int]:
    return [m["step"] for body in service.bodies("/progress") for m in body["metrics"]]


def test_metrics_arrive_in_order_with_rank_node_and_token(
    fake_service: FakeService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNYARD_TOKEN", "s3cret")
    reporter = HttpReporter(fake_service.url, 7, node="gpu001", interval_s=0.05)
    for step in range(1, 51):
        reporter.metric(step, loss=5.0 - step / 100, tokens_per_s=1000.0, step_time_s=0.1)
    reporter.close()
    assert steps_received(fake_service) == list(range(1, 51))
    path, body, headers = fake_service.received[0]
    assert path == "/v1/worker/attempts/7/progress"
    assert (body["rank"], body["node"]) == (0, "gpu001")
    assert set(body["metrics"][0]) == {"step", "loss", "tokens_per_s", "step_time_s"}
    assert headers["Authorization"] == "Bearer s3cret"


def test_an_outage_loses_nothing_and_keeps_order(fake_service: FakeService) -> None:
    fake_service.fail_first["/progress"] = 3
    reporter = HttpReporter(fake_service.url, 7, node="n", interval_s=0.02)
    for step in range(1, 11):
        reporter.metric(step, 4.0, 1.0, 0.1)
    wait_until(lambda: reporter.pending() == 0)
    for step in range(11, 21):
        reporter.metric(step, 4.0, 1.0, 0.1)
    reporter.close()
    assert steps_received(fake_service) == list(range(1, 21))


def test_rows_the_service_refuses_do_not_hold_back_later_ones(fake_service: FakeService) -> None:
    fake_service.fail_first["/progress"], fake_service.failure_status = 1, 422
    reporter = HttpReporter(fake_service.url, 7, node="n", interval_s=0.02)
    reporter.metric(1, 4.0, 1.0, 0.1)
    wait_until(lambda: reporter.pending() == 0)
    reporter.metric(2, 4.0, 1.0, 0.1)
    reporter.close()
    assert steps_received(fake_service) == [2]


def test_service_down_never_blocks_and_caps_the_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_reporter, "MAX_BUFFERED", 5)
    reporter = HttpReporter(f"http://127.0.0.1:{free_port()}", 7, node="n", interval_s=0.01)
    start = time.monotonic()
    for step in range(8):
        reporter.metric(step, 4.0, 1.0, 0.1)
    assert time.monotonic() - start < 0.5
    assert (reporter.pending(), reporter.dropped) == (5, 3)
    monkeypatch.setattr(http_reporter, "CHECKPOINT_RETRY_S", 0.3)
    reporter.checkpoint(5, "/ckpt/step_00000005", "COMMITTED", 10, 0.1)  # gives up, no raise
    reporter.close(drain_timeout_s=0)


def test_cancelling_run_state_is_seen(fake_service: FakeService) -> None:
    fake_service.run_state = "CANCELLING"
    reporter = HttpReporter(fake_service.url, 7, node="n", interval_s=0.02)
    reporter.metric(1, 4.0, 1.0, 0.1)
    wait_until(lambda: reporter.cancel_requested)
    reporter.close()


def test_checkpoint_registration_is_retried_until_delivered(fake_service: FakeService) -> None:
    fake_service.fail_first["/checkpoints"] = 2
    reporter = HttpReporter(fake_service.url, 7, node="n", interval_s=10.0)
    reporter.checkpoint(20, "/ckpt/step_00000020", "COMMITTED", num_bytes=123, write_s=0.4)
    assert fake_service.bodies("/checkpoints") == [
        {
            "step": 20,
            "path": "/ckpt/step_00000020",
            "state": "COMMITTED",
            "num_bytes": 123,
            "write_s": 0.4,
        }
    ]
    reporter.metric(20, 3.0, 1.0, 0.1)
    reporter.finish(final_step=20, final_checkpoint_step=20)  # flushes metrics first
    reporter.close()
    assert steps_received(fake_service) == [20]
    assert fake_service.bodies("/finish") == [{"final_step": 20, "final_checkpoint_step": 20}]


def test_fetch_config(fake_service: FakeService, tmp_path: Path) -> None:
    fake_service.config = tiny_spec(tmp_path / "ckpt", tmp_path / "data", attempt_id=7)
    fake_service.fail_first["/config"] = 1  # a blip is retried
    config = fetch_config(fake_service.url, 7)
    assert config.attempt_id == 7 and config.model.hidden == 128
    fake_service.config = {"model": "nonsense"}
    with pytest.raises(DoNotRetryError, match="invalid config"):
        fetch_config(fake_service.url, 7)


def test_fetch_config_of_an_unknown_attempt_is_final(fake_service: FakeService) -> None:
    with pytest.raises(DoNotRetryError, match="404"):
        fetch_config(fake_service.url, 8)


def test_a_dying_rank_reports_its_collective_error(fake_service: FakeService) -> None:
    fake_service.fail_first["/errors"] = 1
    post_error(
        fake_service.url, 7, rank=1, node="gpu002", kind="nccl:connection_reset", message="x"
    )
    assert fake_service.bodies("/errors") == [
        {"rank": 1, "node": "gpu002", "kind": "nccl:connection_reset", "message": "x"}
    ]


def test_held_out_losses_reach_the_service_through_an_outage(fake_service: FakeService) -> None:
    fake_service.fail_first["/progress"] = 2
    reporter = HttpReporter(fake_service.url, 7, node="n", interval_s=0.02)
    reporter.metric(10, 4.0, 1.0, 0.1)
    reporter.validation(10, 3.5)
    wait_until(lambda: reporter.pending() == 0)
    reporter.validation(20, 3.25)  # with no step rows pending: still sent, also at close
    reporter.close()
    held_out = [v for body in fake_service.bodies("/progress") for v in body["validation"]]
    assert held_out == [{"step": 10, "loss": 3.5}, {"step": 20, "loss": 3.25}]
