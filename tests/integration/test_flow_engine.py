"""flows/engine.py: a flow run still sends its heartbeats, and its end no longer waits out the heartbeat thread's
1-second sleep (Prefect's own engine did: up to 1 s at the end of every flow and subflow run)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("prefect", reason="Prefect is not installed (a bare GPU node): the flow engine is not used there")
import prefect.flow_engine  # noqa: E402

from flows import engine
from flows.engine import flow

pytestmark = pytest.mark.slow


SEEN: dict = {}  # what the flow's body saw (a flow's parameters are copies)


@flow(name="engine-check")
def quick() -> str:
    from prefect.runtime import flow_run

    seen = SEEN
    seen["threads"] = [t for t in threading.enumerate() if "heartbeat" in repr(getattr(t, "_args", ""))]
    seen["body_end"] = time.monotonic()
    return flow_run.id


def run_end(send_heartbeats) -> tuple[float, list[threading.Thread], str]:
    """Seconds from the end of the flow's body to the return of the flow call, with this heartbeat function."""
    installed = prefect.flow_engine._send_heartbeats
    prefect.flow_engine._send_heartbeats = send_heartbeats
    try:
        SEEN.clear()
        run_id = quick()
        return time.monotonic() - SEEN["body_end"], SEEN["threads"], run_id
    finally:
        prefect.flow_engine._send_heartbeats = installed


def test_a_flow_run_sends_heartbeats_and_its_end_does_not_wait_out_their_sleep(prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    assert prefect.flow_engine._send_heartbeats is engine._send_heartbeats  # installed on this Prefect
    started = datetime.now(UTC)
    ours, (thread,), run_id = run_end(engine._send_heartbeats)
    assert not thread.is_alive()  # joined: nothing of the run is left sending during teardown
    theirs, _, _ = run_end(engine.PREFECTS_OWN)
    assert theirs - ours > 0.3, f"the run's end took {ours:.2f} s here and {theirs:.2f} s with Prefect's own"

    event_filter = EventFilter(
        event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
        occurred=EventOccurredFilter(since=started - timedelta(seconds=5), until=started + timedelta(minutes=5)),
    )
    deadline, events = time.monotonic() + 30, []
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:  # events reach the API asynchronously
            events = client.read_events(filter=event_filter, limit=50).events
            if any(e.resource.id == f"prefect.flow-run.{run_id}" for e in events):
                break
            time.sleep(0.5)
    assert any(e.resource.id == f"prefect.flow-run.{run_id}" for e in events), "no heartbeat from the flow run"
