"""S3KeysUnchangedTrigger against a real S3 API server (moto), the inactivity clock on a fake clock.

The official rule (``S3KeysUnchangedSensor.is_keys_unchanged``, tests/fixtures/official/amazon/s3.py)
is the reference: new keys restart the clock, keys gone restart it or fail the wait, and the wait
succeeds once the set has stayed the same for ``inactivity_period`` with at least ``min_objects``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from airflow_deferrable_kit._s3.client import load_options
from airflow_deferrable_kit._s3.poller import open_poller
from airflow_deferrable_kit.testing import FakeClock, run_trigger_payload
from airflow_deferrable_kit.triggers import s3_unchanged
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.s3_unchanged import S3KeysUnchangedTrigger, keys_fingerprint
from tests.integration.s3.conftest import SECRET, put_many

START = 1_800_000_000.0


class ScriptedClock(FakeClock):
    """A fake clock that, during its n-th sleep (1-based), runs ``steps[n]`` against S3."""

    def __init__(self, steps: dict[int, Callable[[], Awaitable[Any]]] | None = None) -> None:
        super().__init__(start=START)
        self.steps = dict(steps or {})

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        step = self.steps.pop(len(self.sleeps), None)
        if step is not None:
            await step()
        await asyncio.sleep(0)


def iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.timezone.utc).isoformat()


def unchanged(clock: FakeClock, **kwargs: Any) -> S3KeysUnchangedTrigger:
    kwargs.setdefault("poll_interval", 60)
    kwargs.setdefault("inactivity_period", 300)
    kwargs.setdefault("prefix", "out/")
    kwargs.setdefault("deadline", deadline_after(24 * 3600, clock=clock))
    trigger = S3KeysUnchangedTrigger(**kwargs)
    trigger.clock = clock  # type: ignore[misc]
    trigger.spread_polls = False  # type: ignore[misc]  # no random first phase: the sleeps are exact
    return trigger


async def test_succeeds_once_unchanged_for_the_period_and_says_count_size_and_last_change(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    await put_many(admin, bucket, ["out/a.csv", "out/b.csv", "out/deep/c.csv"], body=b"12345")
    await admin.put_object(Bucket=bucket, Key="other/x.csv", Body=b"not under the prefix")
    clock = ScriptedClock()

    payload = await run_trigger_payload(unchanged(clock, bucket_name=bucket, aws_conn_id=moto_conn))

    assert payload == {
        "status": "success",
        "bucket": bucket,
        "prefix": "out/",
        "object_count": 3,
        "total_size": 15,
        "last_changed": iso(START),  # the first listing found keys where none were known
        "unchanged_for": 300.0,
        "inactivity_period": 300,
    }
    assert clock.sleeps == [60] * 5
    assert SECRET not in json.dumps(payload)


async def test_a_new_key_restarts_the_inactivity_clock(admin: Any, bucket: str, moto_conn: str) -> None:
    await put_many(admin, bucket, ["out/a.csv", "out/b.csv"])
    clock = ScriptedClock({2: lambda: admin.put_object(Bucket=bucket, Key="out/c.csv", Body=b"c")})

    payload = await run_trigger_payload(unchanged(clock, bucket_name=bucket, aws_conn_id=moto_conn))

    assert payload["status"] == "success"
    assert payload["object_count"] == 3
    assert payload["last_changed"] == iso(START + 120)  # the poll after the put saw it
    assert clock.now == START + 120 + 300


async def test_a_rewritten_key_is_no_change_as_officially(admin: Any, bucket: str, moto_conn: str) -> None:
    await admin.put_object(Bucket=bucket, Key="out/a.csv", Body=b"first")
    clock = ScriptedClock({2: lambda: admin.put_object(Bucket=bucket, Key="out/a.csv", Body=b"rewritten!")})

    payload = await run_trigger_payload(unchanged(clock, bucket_name=bucket, aws_conn_id=moto_conn))

    assert (payload["status"], payload["last_changed"], payload["total_size"]) == ("success", iso(START), 10)


async def test_a_deleted_key_fails_the_wait_without_allow_delete(admin: Any, bucket: str, moto_conn: str) -> None:
    await put_many(admin, bucket, ["out/a.csv", "out/b.csv"])
    clock = ScriptedClock({1: lambda: admin.delete_object(Bucket=bucket, Key="out/b.csv")})

    payload = await run_trigger_payload(unchanged(clock, bucket_name=bucket, aws_conn_id=moto_conn, allow_delete=False))

    assert payload["status"] == "error"
    assert payload["error_type"] == "condition_failed"
    assert (
        f"s3://{bucket}/out/: 1 key(s) were deleted between two polls: out/b.csv (allow_delete=False)"
        in (payload["message"])
    )
    assert clock.now == START + 60


async def test_a_deleted_key_restarts_the_clock_with_allow_delete(admin: Any, bucket: str, moto_conn: str) -> None:
    await put_many(admin, bucket, ["out/a.csv", "out/b.csv"])
    clock = ScriptedClock({3: lambda: admin.delete_object(Bucket=bucket, Key="out/b.csv")})

    payload = await run_trigger_payload(unchanged(clock, bucket_name=bucket, aws_conn_id=moto_conn))

    assert (payload["status"], payload["object_count"]) == ("success", 1)
    assert payload["last_changed"] == iso(START + 180)


async def test_a_replaced_key_is_a_deletion(admin: Any, bucket: str, moto_conn: str) -> None:
    """One key gone and another new between two polls: officially a deletion (``previous - current``)."""
    await put_many(admin, bucket, ["out/a.csv", "out/b.csv"])

    async def replace() -> None:
        await admin.delete_object(Bucket=bucket, Key="out/b.csv")
        await admin.put_object(Bucket=bucket, Key="out/c.csv", Body=b"c")

    clock = ScriptedClock({1: replace})
    payload = await run_trigger_payload(unchanged(clock, bucket_name=bucket, aws_conn_id=moto_conn, allow_delete=False))
    assert (payload["status"], payload["error_type"]) == ("error", "condition_failed")


async def test_previous_objects_is_what_the_first_listing_is_compared_with(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    await admin.put_object(Bucket=bucket, Key="out/a.csv", Body=b"a")
    clock = ScriptedClock()
    trigger = unchanged(
        clock, bucket_name=bucket, aws_conn_id=moto_conn, allow_delete=False, previous_objects=["out/a.csv", "out/z"]
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "error"
    assert "out/z" in payload["message"]
    assert clock.sleeps == []  # the first listing already misses a previous key


async def test_too_few_objects_keep_it_waiting_until_the_deadline(admin: Any, bucket: str, moto_conn: str) -> None:
    await put_many(admin, bucket, ["out/a.csv", "out/b.csv"])
    clock = ScriptedClock()
    trigger = unchanged(
        clock, bucket_name=bucket, aws_conn_id=moto_conn, min_objects=3, deadline=deadline_after(900, clock=clock)
    )
    payload = await run_trigger_payload(trigger)
    assert payload["status"] == "timeout"
    assert len(clock.sleeps) == 15  # it polled on through the deadline, never succeeding with 2 < 3


async def test_an_empty_prefix_succeeds_with_min_objects_zero(bucket: str, moto_conn: str) -> None:
    clock = ScriptedClock()
    payload = await run_trigger_payload(
        unchanged(clock, bucket_name=bucket, aws_conn_id=moto_conn, min_objects=0, inactivity_period=120)
    )
    assert (payload["status"], payload["object_count"], payload["total_size"]) == ("success", 0, 0)
    assert clock.now == START + 120


async def test_the_last_poll_comes_when_the_period_ends_not_an_interval_later(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    await admin.put_object(Bucket=bucket, Key="out/a.csv", Body=b"a")
    clock = ScriptedClock()
    payload = await run_trigger_payload(
        unchanged(clock, bucket_name=bucket, aws_conn_id=moto_conn, inactivity_period=90)
    )
    assert payload["status"] == "success"
    assert clock.sleeps == [60, 30]  # officially, up to one poke_interval after the period


# ------------------------------------------------------------------------- the hand-over
def look(observed_at: float, changed_at: float, keys: list[str], *, digests: bool = False) -> dict[str, Any]:
    """A hand-over as the sensor makes it; with ``digests`` as it makes it with ``allow_delete=False``."""
    handed: dict[str, Any] = {
        "observed_at": iso(observed_at),
        "changed_at": iso(changed_at),
        "fingerprint": keys_fingerprint(keys),
        "count": len(keys),
    }
    if digests:
        handed["digests"] = s3_unchanged.keys_digests(keys)
    return handed


async def test_a_fresh_hand_over_keeps_its_inactivity_clock(admin: Any, bucket: str, moto_conn: str) -> None:
    keys = ["out/a.csv", "out/b.csv"]
    await put_many(admin, bucket, keys)
    clock = ScriptedClock()
    trigger = unchanged(clock, bucket_name=bucket, aws_conn_id=moto_conn, last_look=look(START - 5, START - 250, keys))
    payload = await run_trigger_payload(trigger)
    assert (payload["status"], payload["last_changed"]) == ("success", iso(START - 250))
    assert clock.sleeps == [50]


async def test_a_stale_hand_over_restarts_the_clock_rather_than_vouch_for_the_gap(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    """A triggerer restart rebuilds the trigger from the deferral's kwargs; hours later, keys could
    have come and gone unseen, so the clock restarts (later than officially, never earlier)."""
    keys = ["out/a.csv"]
    await put_many(admin, bucket, keys)
    clock = ScriptedClock()
    trigger = unchanged(
        clock, bucket_name=bucket, aws_conn_id=moto_conn, last_look=look(START - 3600, START - 3600, keys)
    )
    payload = await run_trigger_payload(trigger)
    assert (payload["status"], payload["last_changed"]) == ("success", iso(START))
    assert clock.now == START + 300


async def test_a_hand_over_with_more_keys_than_now_is_a_deletion(admin: Any, bucket: str, moto_conn: str) -> None:
    await admin.put_object(Bucket=bucket, Key="out/a.csv", Body=b"a")
    clock = ScriptedClock()
    trigger = unchanged(
        clock,
        bucket_name=bucket,
        aws_conn_id=moto_conn,
        allow_delete=False,
        last_look=look(START - 5, START - 100, ["out/a.csv", "out/b.csv"], digests=True),
    )
    payload = await run_trigger_payload(trigger)
    assert (payload["status"], payload["error_type"]) == ("error", "condition_failed")
    assert "1 key(s) were deleted" in payload["message"]


@pytest.mark.parametrize(
    ("observed_at", "now"),
    [(START - 5, ["out/a.csv", "out/c.csv"]), (START - 3600, ["out/a.csv", "out/c.csv", "out/d.csv"])],
    ids=["as-many-keys-just-handed-over", "more-keys-after-a-triggerer-restart"],
)
async def test_a_hand_over_key_replaced_by_another_is_a_deletion(
    admin: Any, bucket: str, moto_conn: str, observed_at: float, now: list[str]
) -> None:
    """Officially ``previous - current`` is a deletion whatever was added beside it. The fingerprint
    alone took it for new keys (a restarted clock), fresh or stale hand-over alike."""
    await put_many(admin, bucket, now)
    clock = ScriptedClock()
    trigger = unchanged(
        clock,
        bucket_name=bucket,
        aws_conn_id=moto_conn,
        allow_delete=False,
        last_look=look(observed_at, observed_at - 100, ["out/a.csv", "out/b.csv"], digests=True),
    )
    payload = await run_trigger_payload(trigger)
    assert (payload["status"], payload["error_type"]) == ("error", "condition_failed")
    assert f"s3://{bucket}/out/: 1 key(s) were deleted between two polls (allow_delete=False)" in payload["message"]
    assert clock.sleeps == []  # the first listing decides


async def test_a_hand_over_of_another_set_of_as_many_keys_restarts_the_clock_with_allow_delete(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    await put_many(admin, bucket, ["out/a.csv", "out/c.csv"])
    clock = ScriptedClock()
    trigger = unchanged(
        clock,
        bucket_name=bucket,
        aws_conn_id=moto_conn,
        last_look=look(START - 5, START - 290, ["out/a.csv", "out/b.csv"]),
    )
    payload = await run_trigger_payload(trigger)
    assert (payload["status"], payload["last_changed"]) == ("success", iso(START))


async def test_a_hand_over_of_another_set_restarts_the_clock(admin: Any, bucket: str, moto_conn: str) -> None:
    await put_many(admin, bucket, ["out/a.csv", "out/b.csv"])
    clock = ScriptedClock()
    trigger = unchanged(
        clock, bucket_name=bucket, aws_conn_id=moto_conn, last_look=look(START - 5, START - 290, ["out/a.csv"])
    )
    payload = await run_trigger_payload(trigger)
    assert (payload["status"], payload["last_changed"]) == ("success", iso(START))
    assert clock.now == START + 300


# ------------------------------------------------------------------------ the bound
async def test_a_prefix_past_the_page_bound_fails_clearly(
    admin: Any, bucket: str, moto_conn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_unchanged, "MAX_PREFIX_PAGES", 1)
    await put_many(admin, bucket, [f"out/part-{i:04d}" for i in range(1001)])  # two pages
    payload = await run_trigger_payload(unchanged(ScriptedClock(), bucket_name=bucket, aws_conn_id=moto_conn))
    assert (payload["status"], payload["error_type"]) == ("error", "bad_configuration")
    assert f"s3://{bucket}/out/ holds more than 1 pages of objects" in payload["message"]
    assert "narrower prefix" in payload["message"]


async def test_a_missing_bucket_fails_at_once(moto_conn: str) -> None:
    clock = ScriptedClock()
    payload = await run_trigger_payload(unchanged(clock, bucket_name="adk-no-such-bucket-here", aws_conn_id=moto_conn))
    assert (payload["status"], payload["error_type"]) == ("error", "not_found")
    assert clock.sleeps == []


# ------------------------------------------------------------------------ shared listings
async def test_bounded_listings_share_with_each_other_and_with_an_unbounded_one(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    await put_many(admin, bucket, ["out/a.csv", "out/b.csv"])
    poller = await open_poller(await load_options(moto_conn))
    try:
        first, second = await asyncio.gather(
            poller.list_prefix_within(bucket, "out/", max_age=30, max_pages=10),
            poller.list_prefix_within(bucket, "out/", max_age=30, max_pages=10),
        )
        assert first is second  # one request for both
        wildcard = await poller.list_prefix_within(bucket, "other/", max_age=30)
        assert await poller.list_prefix_within(bucket, "other/", max_age=30, max_pages=10) is wildcard
        again = await poller.list_prefix_within(bucket, "out/", max_age=30, max_pages=10, seen=id(first))
        assert again is not first  # a caller never judges the same listing twice
        assert again.keys == first.keys == ("out/a.csv", "out/b.csv")
    finally:
        await poller.close()


# ------------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bucket_name": "Not_A_Bucket"}, "bucket_name must name a valid S3 bucket"),
        ({"prefix": None}, "prefix must be a string"),
        ({"prefix": "s3://bucket-a/out/"}, "prefix must be a key prefix relative to bucket_name"),
        ({"inactivity_period": -1}, "inactivity_period"),
        ({"inactivity_period": float("inf")}, "inactivity_period"),
        ({"min_objects": -1}, "min_objects"),
        ({"min_objects": True}, "min_objects"),
        ({"allow_delete": "no"}, "allow_delete"),
        ({"aws_conn_id": " "}, "aws_conn_id"),
        ({"previous_objects": ["a", 3]}, "previous_objects"),
        ({"last_look": {"observed_at": "2030-01-01T00:00:00+00:00"}}, "last_look must be a dict with"),
        (
            {"last_look": {"observed_at": "2030-01-01T00:00:00", "changed_at": "2030-01-01T00:00:00+00:00"}},
            "last_look.observed_at",
        ),
        (
            {"last_look": {"observed_at": "2030-01-01T00:00:00+00:00", "changed_at": "2030-01-02T00:00:00+00:00"}},
            "last_look.changed_at must not be after",
        ),
        (
            {
                "last_look": {
                    "observed_at": "2030-01-01T00:00:00+00:00",
                    "changed_at": "2030-01-01T00:00:00+00:00",
                    "fingerprint": "abc",
                    "count": 1,
                }
            },
            "last_look.fingerprint",
        ),
        (
            {
                "allow_delete": False,
                "last_look": {
                    "observed_at": "2030-01-01T00:00:00+00:00",
                    "changed_at": "2030-01-01T00:00:00+00:00",
                    "fingerprint": "0" * 64,
                    "count": 1,
                },
            },
            "last_look needs digests with allow_delete=False",
        ),
        (
            {
                "allow_delete": False,
                "last_look": {
                    "observed_at": "2030-01-01T00:00:00+00:00",
                    "changed_at": "2030-01-01T00:00:00+00:00",
                    "fingerprint": "0" * 64,
                    "count": 2,
                    "digests": "0" * 16,
                },
            },
            r"last_look.digests holds 1 key\(s\) but last_look.count is 2",
        ),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(kwargs: dict[str, Any], match: str) -> None:
    arguments: dict[str, Any] = {"bucket_name": "bucket-a", "prefix": "out/", **kwargs}
    with pytest.raises(ValueError, match=match):
        S3KeysUnchangedTrigger(**arguments)
