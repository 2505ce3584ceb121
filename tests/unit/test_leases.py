"""Shared clients: built once per key and loop, reference counted, closed by the last release."""

from __future__ import annotations

import asyncio

import pytest

from airflow_deferrable_kit import leases


class Recorder:
    def __init__(self, delay: float = 0.01, fail: bool = False) -> None:
        self.delay = delay
        self.fail = fail
        self.built = 0
        self.closed: list[str] = []

    async def build(self) -> str:
        self.built += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise ConnectionRefusedError("no server")
        return f"client{self.built}"

    async def close(self, client: str) -> None:
        self.closed.append(client)


async def test_concurrent_acquires_build_one_client_and_the_last_release_closes_it() -> None:
    rec = Recorder()
    got = await asyncio.gather(*(leases.acquire("k1", rec.build, rec.close) for _ in range(1000)))
    assert set(got) == {"client1"}
    assert rec.built == 1
    assert leases.held_keys() == {"k1": 1000}
    for _ in range(999):
        await leases.release("k1")
    assert rec.closed == []
    await leases.release("k1")
    assert rec.closed == ["client1"]
    assert leases.held_keys() == {}


async def test_cancelling_the_first_asker_does_not_fail_the_others() -> None:
    rec = Recorder(delay=0.05)
    first = asyncio.ensure_future(leases.acquire("k2", rec.build, rec.close))
    await asyncio.sleep(0)
    others = [asyncio.ensure_future(leases.acquire("k2", rec.build, rec.close)) for _ in range(3)]
    await asyncio.sleep(0.01)
    first.cancel()
    assert await asyncio.gather(*others) == ["client1"] * 3
    assert leases.held_keys() == {"k2": 3}
    for _ in range(3):
        await leases.release("k2")
    assert rec.closed == ["client1"]


async def test_a_client_whose_every_asker_left_is_closed_once_built() -> None:
    rec = Recorder(delay=0.05)
    asker = asyncio.ensure_future(leases.acquire("k3", rec.build, rec.close))
    await asyncio.sleep(0.01)
    asker.cancel()
    await asyncio.gather(asker, return_exceptions=True)
    assert leases.held_keys() == {}
    await asyncio.sleep(0.1)
    assert rec.closed == ["client1"]


async def test_a_failed_build_reaches_every_asker_and_is_retried_afresh() -> None:
    rec = Recorder(fail=True)
    results = await asyncio.gather(
        *(leases.acquire("k4", rec.build, rec.close) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, ConnectionRefusedError) for r in results)
    assert rec.built == 1
    assert leases.held_keys() == {}
    rec.fail = False
    assert await leases.acquire("k4", rec.build, rec.close) == "client2"
    await leases.release("k4")


async def test_a_client_that_cannot_be_built_or_hangs_harms_no_other_key() -> None:
    """The poisoned member of the shared-client registry: one key whose build fails, one whose
    build hangs, among 50 healthy keys asked at the same moment."""
    healthy = {f"ok{i}": Recorder(delay=0.01) for i in range(50)}
    broken, hanging = Recorder(fail=True), Recorder(delay=3600)
    stuck = asyncio.ensure_future(leases.acquire("hangs", hanging.build, hanging.close))
    results = await asyncio.gather(
        leases.acquire("fails", broken.build, broken.close),
        *(leases.acquire(key, rec.build, rec.close) for key, rec in healthy.items()),
        return_exceptions=True,
    )
    assert isinstance(results[0], ConnectionRefusedError)
    assert results[1:] == ["client1"] * 50  # every healthy key built its own client, at once
    assert not stuck.done()
    assert {key: leases.held_keys()[key] for key in healthy} == dict.fromkeys(healthy, 1)
    for key in healthy:
        await leases.release(key)
    stuck.cancel()
    await asyncio.gather(stuck, return_exceptions=True)
    assert leases.held_keys() == {}


def test_each_event_loop_has_its_own_clients() -> None:
    rec = Recorder()

    async def use() -> str:
        client = await leases.acquire("k5", rec.build, rec.close)
        await leases.release("k5")
        return str(client)

    assert asyncio.run(use()) == "client1"
    assert asyncio.run(use()) == "client2"
    assert rec.closed == ["client1", "client2"]


async def test_leases_release_only_what_they_hold() -> None:
    rec = Recorder()
    mine, theirs = leases.Leases(), leases.Leases()
    assert await mine.get("k6", rec.build, rec.close) == await mine.get("k6", rec.build, rec.close)
    await theirs.get("k6", rec.build, rec.close)
    assert leases.held_keys() == {"k6": 2}
    await mine.release_all()
    await mine.release_all()  # idempotent
    assert leases.held_keys() == {"k6": 1}
    await theirs.release_all()
    assert rec.closed == ["client1"]


async def test_a_trigger_holding_several_leases_releases_each_once() -> None:
    rec = Recorder()
    held = leases.Leases()
    first = await held.get("k7", rec.build, rec.close)
    second = await held.get("k8", rec.build, rec.close)
    third = await held.get("k9", rec.build, rec.close)
    assert [await held.get(key, rec.build, rec.close) for key in ("k7", "k8", "k9")] == [first, second, third]
    assert len(held) == 3 and leases.held_keys() == {"k7": 1, "k8": 1, "k9": 1}
    await held.release_all()
    assert len(held) == 0 and leases.held_keys() == {}
    assert sorted(rec.closed) == sorted([first, second, third])


@pytest.mark.parametrize("count", [1, 3])
async def test_release_of_an_unknown_key_is_harmless(count: int) -> None:
    for _ in range(count):
        await leases.release("never-acquired")
    assert leases.held_keys() == {}
