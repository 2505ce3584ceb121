"""The polling trigger's contract: serialization, deadline, backoff, errors, one event, cleanup."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import gc
import json
import time
import weakref

import pytest
from airflow.triggers.base import TaskFailedEvent, TaskSkippedEvent, TaskSuccessEvent, TriggerEvent
from hypothesis import given
from hypothesis import strategies as st

from airflow_deferrable_kit import leases
from airflow_deferrable_kit.payload import MAX_PAYLOAD_BYTES, Found
from airflow_deferrable_kit.testing import FakeClock, run_trigger, run_trigger_payload
from airflow_deferrable_kit.triggers.base import MIN_RETRY_DELAY, PollingTrigger
from airflow_deferrable_kit.triggers.timing import TURN_BUDGET, WAKES_PER_TURN_START, deadline_after
from tests.unit.sample import CHECKS, LeasingTrigger, ScriptedSensor, ScriptedTrigger, script


def scripted(name: str, *steps: str, clock: FakeClock | None = None, **kwargs: object) -> ScriptedTrigger:
    trigger = ScriptedTrigger(script=script(name, *steps), **kwargs)  # type: ignore[arg-type]
    if clock is not None:
        trigger.clock = clock  # type: ignore[misc]
    return trigger


# ----------------------------------------------------------------------------- serialization
@given(
    poll_interval=st.floats(min_value=0.001, max_value=1e6, allow_nan=False),
    note=st.text(max_size=50),
    tags=st.lists(st.text(max_size=10), max_size=5),
    seconds=st.floats(min_value=-1e6, max_value=1e8, allow_nan=False),
    end_from_trigger=st.booleans(),
)
def test_serialize_round_trips_exactly_through_json(
    poll_interval: float, note: str, tags: list[str], seconds: float, end_from_trigger: bool
) -> None:
    trigger = ScriptedTrigger(
        script="s",
        note=note,
        tags=tags,
        poll_interval=poll_interval,
        deadline=deadline_after(seconds),
        end_from_trigger=end_from_trigger,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "tests.unit.sample.ScriptedTrigger"
    rebuilt = ScriptedTrigger(**json.loads(json.dumps(kwargs)))
    assert rebuilt == trigger
    assert rebuilt.serialize() == (classpath, kwargs)


def test_kwargs_hold_only_json_primitives_and_reject_others() -> None:
    with pytest.raises(TypeError, match=r"ScriptedTrigger kwargs at \$\.tags\[0\].*only JSON primitives"):
        ScriptedTrigger(script="s", tags=[dt.date(2024, 1, 1)])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"poll_interval": 0}, "poll_interval must be a positive number"),
        ({"poll_interval": -5}, "poll_interval must be a positive number"),
        ({"max_backoff": "10"}, "max_backoff must be a positive number"),
        ({"deadline": "tomorrow"}, "deadline must be an ISO 8601"),
        ({"deadline": "2030-01-01T00:00:00"}, "deadline must carry a UTC offset"),
        ({"deadline": "9999-12-31T23:00:00-05:00"}, "deadline must be a moment between 0001-01-01 and 9999-12-31"),
        ({"poll_interval": 1e12}, r"poll_interval must be a positive number of seconds, at most 3,153,600,000"),
        ({"poll_interval": float("inf")}, "poll_interval must be a positive number"),
        ({"max_backoff": float("nan")}, "max_backoff must be a positive number"),
        ({"max_backoff": True}, "max_backoff must be a positive number"),
        ({"script": ""}, "script must be a non-empty name"),
    ],
)
def test_bad_arguments_fail_at_construction_naming_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScriptedTrigger(**{"script": "s", **kwargs})


# ---------------------------------------------------------------------------------- the loop
async def test_success_after_not_yet_polls_at_the_interval() -> None:
    clock = FakeClock()
    trigger = scripted("ok", "none", "none", "found", clock=clock, poll_interval=7)
    payload = await run_trigger_payload(trigger)
    assert payload == {"status": "success", "script": "ok", "checks": 3}
    first, second = clock.sleeps
    assert 0 < first <= 7  # the random phase: never later than one interval
    assert second == 7  # then exactly the interval


async def test_waits_started_together_poll_at_spread_phases() -> None:
    clocks = [FakeClock() for _ in range(300)]
    triggers = [
        scripted(f"phase-{i}", "none", "none", "found", clock=c, poll_interval=10) for i, c in enumerate(clocks)
    ]
    await asyncio.gather(*(run_trigger_payload(t) for t in triggers))
    phases = sorted(c.sleeps[0] for c in clocks)
    assert all(0 < p <= 10 for p in phases)
    # Spread over the whole interval: every tenth of it holds some first polls.
    assert {int(p) for p in phases} == set(range(10))
    assert all(c.sleeps[1] == 10 for c in clocks)


async def checks_per_loop_iteration(count: int, cost: float) -> collections.Counter[int]:
    """Start ``count`` waits at once whose check busies the loop ``cost`` s; checks per iteration."""
    iteration = 0
    started: list[int] = []

    async def count_iterations() -> None:
        nonlocal iteration
        while True:
            iteration += 1
            await asyncio.sleep(0)

    class Costly(ScriptedTrigger):
        async def check(self) -> Found | None:
            started.append(iteration)
            busy_until = time.perf_counter() + cost  # CPU a real check spends (signing, parsing)
            while time.perf_counter() < busy_until:
                pass
            return await super().check()

    counter = asyncio.create_task(count_iterations())
    try:
        triggers = [Costly(script=script(f"burst-{cost}-{i}", "found")) for i in range(count)]
        payloads = await asyncio.gather(*(run_trigger_payload(t) for t in triggers))
    finally:
        counter.cancel()
    assert [p["status"] for p in payloads] == ["success"] * count
    return collections.Counter(started)


async def test_costly_checks_that_wake_together_are_spread_over_loop_iterations() -> None:
    per_iteration = await checks_per_loop_iteration(200, cost=0.002)
    # 200 x 2 ms in one iteration would stall every other trigger for 0.4 s.
    assert max(per_iteration.values()) <= WAKES_PER_TURN_START
    assert max(per_iteration.values()) * 0.002 <= 2 * TURN_BUDGET
    assert len(per_iteration) >= 200 // WAKES_PER_TURN_START


async def test_cheap_checks_that_wake_together_go_in_growing_batches() -> None:
    per_iteration = await checks_per_loop_iteration(3000, cost=0.0)
    assert max(per_iteration.values()) > WAKES_PER_TURN_START  # the pace grew
    assert len(per_iteration) < 3000 // WAKES_PER_TURN_START


async def test_deadline_is_absolute_so_a_rebuilt_trigger_keeps_the_same_clock() -> None:
    clock = FakeClock()
    deadline = deadline_after(100, clock=clock)
    first = scripted("slow", "none", clock=clock, poll_interval=30, deadline=deadline)
    # A triggerer restart: the trigger is rebuilt from its kwargs 80 s later.
    clock.advance(80)
    rebuilt = ScriptedTrigger(**first.serialize()[1])
    rebuilt.clock = clock  # type: ignore[misc]
    payload = await run_trigger_payload(rebuilt)
    assert payload["status"] == "timeout"
    assert deadline in payload["message"]
    assert sum(clock.sleeps) == pytest.approx(20)  # only the budget left, not a fresh 100 s


async def test_already_expired_deadline_times_out_without_checking() -> None:
    clock = FakeClock()
    trigger = scripted("late", "found", clock=clock, deadline=deadline_after(-1, clock=clock))
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "timeout"
    assert CHECKS["late"] == 0


async def test_a_check_in_flight_at_the_deadline_is_abandoned() -> None:
    trigger = scripted("hang", "hang", deadline=deadline_after(0.2))
    payload = await run_trigger_payload(trigger, timeout=10)
    assert payload["status"] == "timeout"


async def test_a_hanging_check_is_abandoned_after_healthy_polls_and_outside_cancels_still_cancel() -> None:
    """The deadline's one timer outlives healthy checks and cuts the one that hangs; a cancel
    from outside (the triggerer stopping the wait) is never taken for the deadline."""
    trigger = scripted("late-hang", "none", "none", "none", "hang", poll_interval=0.01, deadline=deadline_after(0.5))
    payload = await run_trigger_payload(trigger, timeout=10)
    assert payload["status"] == "timeout"
    assert CHECKS["late-hang"] == 4

    stopped = scripted("stopped", "hang", deadline=deadline_after(3600))
    task = asyncio.ensure_future(run_trigger_payload(stopped, timeout=10))
    for _ in range(1000):
        await asyncio.sleep(0.01)
        if CHECKS.get("stopped", 0):
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_far_deadline_costs_one_timer_for_the_wait_not_one_per_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten thousand waits poll every few seconds against deadlines days away: a timer per poll
    (and its cancelled handle left in the loop's heap) was kept per wait; one is enough."""
    loop = asyncio.get_running_loop()
    far: list[float] = []
    real_call_at = loop.call_at

    def counting(when: float, *args: object, **kwargs: object) -> asyncio.TimerHandle:
        if when > loop.time() + 1000:
            far.append(when)
        return real_call_at(when, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_at", counting)
    trigger = scripted("many-polls", *["none"] * 30, "found", poll_interval=0.001, deadline=deadline_after(86400))
    payload = await run_trigger_payload(trigger, timeout=30)
    assert payload["status"] == "success" and CHECKS["many-polls"] == 31
    assert len(far) == 1


async def test_a_finished_wait_is_not_kept_alive_by_its_deadline() -> None:
    trigger = scripted("done-early", "none", "found", poll_interval=0.001, deadline=deadline_after(86400))
    assert (await run_trigger_payload(trigger))["status"] == "success"
    alive = weakref.ref(trigger)
    del trigger
    gc.collect()
    assert alive() is None


async def test_transient_errors_back_off_exponentially_with_full_jitter_then_reset() -> None:
    clock = FakeClock()
    steps = ["transient"] * 8 + ["none"] + ["transient"] * 2 + ["found"]
    trigger = scripted("storm", *steps, clock=clock, poll_interval=1, max_backoff=60)
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "success"
    assert CHECKS["storm"] == len(steps)
    sleeps = clock.sleeps
    assert len(sleeps) == len(steps) - 1  # a sleep before every check but the first
    for failures, delay in enumerate(sleeps[:8], start=1):
        assert MIN_RETRY_DELAY <= delay <= min(60, 2**failures)
    assert 0 < sleeps[8] <= 1  # the healthy poll resets the backoff: back to (a phase of) the interval
    assert MIN_RETRY_DELAY <= sleeps[9] <= 2  # and the next storm starts from the bottom
    assert MIN_RETRY_DELAY <= sleeps[10] <= 4


async def test_backoff_is_capped_and_jittered() -> None:
    trigger = ScriptedTrigger(script="s", poll_interval=5, max_backoff=30)
    delays = [trigger.backoff_delay(20) for _ in range(500)]
    assert max(delays) <= 30
    assert min(delays) >= MIN_RETRY_DELAY
    assert len({round(d, 3) for d in delays}) > 400  # jittered, not a fixed schedule
    assert sum(delays) / len(delays) == pytest.approx(15, rel=0.15)  # full jitter: mean is cap / 2


async def test_retry_after_is_honoured() -> None:
    clock = FakeClock()
    trigger = scripted("ra", "transient:45", "found", clock=clock, poll_interval=1, max_backoff=10)
    assert (await run_trigger_payload(trigger))["status"] == "success"
    assert clock.sleeps == [45]


async def test_backoff_never_sleeps_past_the_deadline() -> None:
    clock = FakeClock()
    trigger = scripted("cut", "transient:500", clock=clock, poll_interval=1, deadline=deadline_after(12, clock=clock))
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "timeout"
    assert clock.sleeps == [pytest.approx(12)]


async def test_fatal_error_ends_at_once_with_an_error_event() -> None:
    clock = FakeClock()
    trigger = scripted("deny", "none", "fatal", clock=clock, poll_interval=2)
    payload = await run_trigger_payload(trigger)
    assert payload == {"status": "error", "error_type": "authorization", "message": "access denied to the thing"}
    assert len(clock.sleeps) == 1
    assert 0 < clock.sleeps[0] <= 2


async def test_unexpected_exception_is_an_error_event_not_a_crash_or_a_loop() -> None:
    clock = FakeClock()
    payload = await run_trigger_payload(scripted("boom", "boom", clock=clock))
    assert payload["status"] == "error"
    assert payload["error_type"] == "internal"
    assert "KeyError" in payload["message"] and "surprise" in payload["message"]
    assert clock.sleeps == []


@pytest.mark.parametrize(
    ("step", "message"),
    [("bad-payload", "type object, which is not JSON-safe"), ("reserved", "reserved key 'status'")],
)
async def test_unusable_check_data_becomes_a_clear_error_event(step: str, message: str) -> None:
    payload = await run_trigger_payload(scripted(f"bad-{step}", step))
    assert payload["status"] == "error"
    assert payload["error_type"] == "payload_error"
    assert message in payload["message"]


async def test_an_oversized_success_stays_a_success_cut_to_the_cap() -> None:
    from airflow_deferrable_kit.payload import build_payload, json_size

    payload = build_payload("success", {"blob": "x" * MAX_PAYLOAD_BYTES})
    assert payload["status"] == "success"
    assert json_size(payload) <= MAX_PAYLOAD_BYTES
    assert payload["truncated"] == [
        {"path": "$.blob", "kind": "text", "original_chars": MAX_PAYLOAD_BYTES, "kept_chars": ANY_INT}
    ]


class _AnyInt:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and not isinstance(other, bool) and other > 0


ANY_INT = _AnyInt()


async def test_a_host_name_that_never_resolved_is_fatal_after_three_attempts() -> None:
    clock = FakeClock()
    name = script("nxdomain-only", "nxdomain")
    payload = await _run_with(clock, name)
    assert payload["status"] == "error" and payload["error_type"] == "bad_connection"
    assert "never resolved (3 attempts" in payload["message"]
    assert CHECKS[name] == 3 and len(clock.sleeps) == 2  # two backoffs, no retry until the deadline


async def test_dns_failures_after_the_host_once_answered_stay_transient() -> None:
    clock = FakeClock()
    name = script("nxdomain-later", "none", "nxdomain", "nxdomain", "nxdomain", "nxdomain", "found")
    payload = await _run_with(clock, name)
    assert payload["status"] == "success"
    assert CHECKS[name] == 6


async def _run_with(clock: FakeClock, name: str) -> dict:
    trigger = ScriptedTrigger(script=name, poll_interval=5, max_backoff=60, deadline=deadline_after(3600, clock=clock))
    trigger.clock = clock  # type: ignore[misc]
    return await run_trigger_payload(trigger)  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- end_from_trigger
def _worker_outcome(payload: dict, *, soft_fail: bool, never_fail: bool) -> str:
    """How the worker path ends a task given this payload (the sensor's ``finish``)."""
    from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

    from airflow_deferrable_kit.sensors.base import WaitFailedError

    sensor = ScriptedSensor(task_id="outcome", script="s", soft_fail=soft_fail, never_fail=never_fail)
    try:
        sensor.finish(payload)
    except AirflowSkipException:
        return "skipped"
    except AirflowSensorTimeout:
        return "failed, never retried"
    except WaitFailedError:
        return "failed, retried if retries remain"
    return "success"


def _event_outcome(event: TriggerEvent, payload: dict, *, soft_fail: bool, never_fail: bool) -> str:
    """How Airflow ends a task given this event (models/trigger.py handle_event_submit)."""
    if type(event) is TriggerEvent:  # resumes on the worker
        return _worker_outcome(event.payload, soft_fail=soft_fail, never_fail=never_fail)
    return {
        TaskSuccessEvent: "success",
        TaskSkippedEvent: "skipped",
        TaskFailedEvent: "failed, retried if retries remain",  # is_eligible_to_retry
    }[type(event)]


@pytest.mark.parametrize("step", ["found", "fatal", "none"])
@pytest.mark.parametrize(("soft_fail", "never_fail"), [(False, False), (True, False), (False, True)])
async def test_end_from_trigger_ends_every_status_exactly_as_the_worker_path(
    step: str, soft_fail: bool, never_fail: bool
) -> None:
    trigger = scripted(
        f"end-{step}-{soft_fail}-{never_fail}",
        step,
        end_from_trigger=True,
        soft_fail=soft_fail,
        never_fail=never_fail,
        poll_interval=0.01,
        deadline=deadline_after(0.05),
    )
    event = await run_trigger(trigger)
    plain = await run_trigger_payload(
        scripted(f"plain-{step}", step, poll_interval=0.01, deadline=deadline_after(0.05))
    )
    expected = _worker_outcome(plain, soft_fail=soft_fail, never_fail=never_fail)
    assert _event_outcome(event, plain, soft_fail=soft_fail, never_fail=never_fail) == expected
    if step == "none" and not (soft_fail or never_fail):
        # a timeout that fails goes back to the worker: Airflow would retry a TaskFailedEvent
        assert type(event) is TriggerEvent and event.payload["status"] == "timeout"
    elif step == "found":
        assert type(event) is TaskSuccessEvent and event.xcoms is not None
        assert event.xcoms["return_value"]["status"] == "success"  # type: ignore[index,call-overload]
    else:  # a skip or a failure: no XCom, as on the worker path
        assert isinstance(event, (TaskSkippedEvent, TaskFailedEvent)) and event.xcoms is None


async def test_end_from_trigger_without_do_xcom_push_pushes_no_xcom() -> None:
    event = await run_trigger(scripted("no-xcom", "found", end_from_trigger=True, do_xcom_push=False))
    assert type(event) is TaskSuccessEvent and event.xcoms is None


def test_the_sensor_passes_never_fail_and_do_xcom_push_to_its_trigger() -> None:
    sensor = ScriptedSensor(task_id="flags", script="s", never_fail=True, do_xcom_push=False, end_from_trigger=True)
    trigger = sensor.build_trigger(deadline=None)
    assert (trigger.never_fail, trigger.do_xcom_push, trigger.end_from_trigger) == (True, False, True)


@pytest.mark.parametrize("name", ["task_id", "trigger_id", "template_fields", "template_ext", "run", "check"])
def test_a_parameter_named_like_a_base_trigger_attribute_is_refused_when_the_class_is_defined(name: str) -> None:
    with pytest.raises(TypeError, match=f"parameter\\(s\\) {name} clash"):
        type(f"Clashing_{name}", (PollingTrigger,), {"__annotations__": {name: "str"}, name: "x"})


async def test_without_end_from_trigger_the_event_is_a_plain_trigger_event() -> None:
    event = await run_trigger(scripted("plain", "found"))
    assert type(event) is TriggerEvent


# ---------------------------------------------------------------------------- release / cancel
async def test_cancelling_waiting_triggers_releases_their_shared_client() -> None:
    LeasingTrigger.opened.clear()
    LeasingTrigger.closed.clear()
    triggers = [LeasingTrigger(key="k", poll_interval=0.01) for _ in range(50)]
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=60)) for t in triggers]
    for _ in range(100):
        await asyncio.sleep(0.01)
        if leases.held_keys().get(("sample", "k")) == 50 and LeasingTrigger.opened:
            break
    assert leases.held_keys() == {("sample", "k"): 50}
    assert LeasingTrigger.opened == ["k"]  # one client for fifty waits
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert leases.held_keys() == {}
    assert LeasingTrigger.closed == ["client-k"]


async def test_a_fired_trigger_has_released_its_clients_before_the_event_is_handed_over() -> None:
    trigger = LeasingTrigger(key="once", poll_interval=0.01, deadline=deadline_after(0.05))
    events = trigger.run()
    event = await events.__anext__()
    assert event.payload["status"] == "timeout"
    assert leases.held_keys() == {}
