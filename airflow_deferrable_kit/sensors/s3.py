"""Wait for S3 objects, or for the keys under a prefix to stop changing, without holding a worker slot."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar

from airflow.sdk import Context

from airflow_deferrable_kit.sensors.base import DeferrableSensor, OfficialRefusal, unless_default
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from airflow_deferrable_kit.triggers.s3_unchanged import S3KeysUnchangedTrigger

#: The official parameters whose setting lives in the aws connection here, refused unless at their
#: official default (the triggerer builds its client from ``aws_conn_id`` alone).
_CONNECTION_SETTINGS: dict[str, OfficialRefusal] = {
    "region_name": unless_default("set 'region_name' in the extras of the aws connection", None),
    "region": unless_default("set 'region_name' in the extras of the aws connection", None),
    "botocore_config": unless_default("set botocore options in the extra 'config_kwargs' of the aws connection", None),
}


class S3KeySensor(DeferrableSensor):
    """Succeed once every key in ``bucket_key`` exists; the XCom says which objects matched.

    :param bucket_key: a key relative to ``bucket_name``, a full ``s3://bucket/key`` URI, or a
        list of them that must all exist (templated).
    :param bucket_name: bucket of relative keys (templated).
    :param wildcard_match: treat each key as an fnmatch pattern over a listing of its literal
        prefix; each pattern must match at least one object.
    :param min_size: only objects of at least this many bytes count.
    :param aws_conn_id: Airflow ``aws`` connection (templated); ``None`` for the default
        credential chain.
    :param check_fn: the official sensor's callable, run in the worker on what the trigger found:
        ``check_fn(files)`` or ``check_fn(files, **context)``, ``files`` a list of
        ``{"Key", "Size", ...}``. A falsy answer waits on (after one ``poke_interval``) within the
        same ``timeout``. Not with ``end_from_trigger=True``.

    Success returns ``{"status": "success", "keys": [{"bucket", "key", "size", "etag",
    "last_modified"}, ...], "keys_not_listed": N}``. A missing bucket, a 403 or rejected
    credentials fail the task at once (even with ``soft_fail``); throttling, 5xx and network
    errors are retried with backoff.
    """

    trigger_class = S3KeyTrigger
    official_sensor = "S3KeySensor"
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {
        "use_regex": unless_default(
            "keys are matched with fnmatch patterns: use wildcard_match=True with a pattern such as "
            "'data/*/part-*.parquet'",
            False,
        ),
        "metadata_keys": unless_default(
            "the success payload always carries bucket, key, size, etag and last_modified of each object; "
            "other HeadObject metadata is not fetched",
            None,
        ),
        "verify": unless_default(
            "set 'verify' (true, false or a CA bundle path) in the extras of the aws connection: the triggerer "
            "builds its client from aws_conn_id alone",
            None,
            True,  # what generated DAG code writes: certificates are verified unless the connection says not
        ),
        **_CONNECTION_SETTINGS,
    }
    template_fields = ("bucket_key", "bucket_name", "aws_conn_id")
    ui_color = "#ffd8b1"

    bucket_key: str | list[str]
    bucket_name: str | None
    wildcard_match: bool
    min_size: int | None
    aws_conn_id: str | None

    def __init__(
        self,
        *,
        bucket_key: str | list[str] | tuple[str, ...],
        bucket_name: str | None = None,
        wildcard_match: bool = False,
        min_size: int | None = None,
        aws_conn_id: str | None = "aws_default",
        check_fn: Callable[..., bool] | None = None,
        **kwargs: Any,
    ) -> None:
        if check_fn is not None and not callable(check_fn):
            raise TypeError(f"check_fn must be a callable taking the list of matched objects, got {check_fn!r}")
        self.check_fn = check_fn
        super().__init__(
            bucket_key=bucket_key,
            bucket_name=bucket_name,
            wildcard_match=wildcard_match,
            min_size=min_size,
            aws_conn_id=aws_conn_id,
            **kwargs,
        )

    def checks_in_worker(self) -> str | None:
        return "check_fn" if self.check_fn is not None else None

    def accepts_in_worker(self, payload: dict[str, Any], context: Context) -> bool:
        """The official ``check_fn(files)`` (or ``check_fn(files, **context)``) on the matched objects.

        ``files`` has the official shape, one dict per object with ``Key`` and ``Size`` (plus
        ``ETag``, ``LastModified`` and ``Bucket``), so a function written for the official sensor
        runs unchanged. A falsy answer waits on within the same timeout.
        """
        assert self.check_fn is not None
        files = [
            {
                "Key": item["key"],
                "Size": item["size"],
                "ETag": item.get("etag"),
                "LastModified": item.get("last_modified"),
                "Bucket": item.get("bucket"),
            }
            for item in payload.get("keys", [])
        ]
        parameters = inspect.signature(self.check_fn).parameters.values()
        if any(parameter.kind == inspect.Parameter.VAR_KEYWORD for parameter in parameters):
            return bool(self.check_fn(files, **context))
        return bool(self.check_fn(files))


class S3KeysUnchangedSensor(DeferrableSensor):
    """Succeed once the keys under ``prefix`` have not changed for ``inactivity_period`` seconds.

    The official ``S3KeysUnchangedSensor``'s rule, deferrable: each poll lists the prefix (keys at
    any depth) and compares its keys with the last poll's. New keys restart the inactivity clock;
    keys gone restart it with ``allow_delete=True`` and fail the task with ``allow_delete=False``.
    Once the set has stayed the same for ``inactivity_period`` and holds at least ``min_objects``
    keys, the task succeeds; with fewer it waits on (until ``timeout``), as officially.

    :param bucket_name: the bucket (templated).
    :param prefix: the key prefix, ``""`` for the whole bucket (templated).
    :param inactivity_period: seconds the set of keys must stay the same.
    :param min_objects: keys the prefix must hold for the wait to succeed.
    :param previous_objects: keys the first look compares with (a set or list); keys of it that are
        missing count as deleted.
    :param allow_delete: whether keys may disappear (restarting the clock) or fail the task.
    :param aws_conn_id: Airflow ``aws`` connection (templated); ``None`` for the default chain.

    Success returns ``{"status": "success", "bucket", "prefix", "object_count", "total_size",
    "last_changed", "unchanged_for", "inactivity_period"}``. ``deferrable=False`` pokes in
    ``mode="poke"`` only (the last look lives in the running task), as the official sensor.
    """

    trigger_class = S3KeysUnchangedTrigger
    official_sensor = "S3KeysUnchangedSensor"
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {
        "verify": unless_default(
            "set 'verify' (false or a CA bundle path) in the extras of the aws connection: the triggerer builds "
            "its client from aws_conn_id alone (verify=None or True, the default, is accepted)",
            None,
            True,
        ),
        **_CONNECTION_SETTINGS,
    }
    template_fields = ("bucket_name", "prefix", "aws_conn_id")
    ui_color = "#ffd8b1"

    bucket_name: str
    prefix: str
    inactivity_period: float
    min_objects: int
    previous_objects: list[str] | None
    allow_delete: bool
    aws_conn_id: str | None

    def __init__(
        self,
        *,
        bucket_name: str,
        prefix: str,
        inactivity_period: float = 60 * 60,
        min_objects: int = 1,
        previous_objects: Collection[str] | None = None,
        allow_delete: bool = True,
        aws_conn_id: str | None = "aws_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            bucket_name=bucket_name,
            prefix=prefix,
            inactivity_period=inactivity_period,
            min_objects=min_objects,
            previous_objects=_key_list(previous_objects),
            allow_delete=allow_delete,
            aws_conn_id=aws_conn_id,
            **kwargs,
        )
        if not self.deferrable and self.mode == "reschedule":
            raise ValueError(
                f"{type(self).__name__} (task_id={self.task_id!r}): mode='reschedule' cannot work with "
                "deferrable=False: the keys of the last poke live in the running task and a reschedule "
                "loses them (the official sensor is poke-only too); use mode='poke' or deferrable=True"
            )

    @classmethod
    def wait_parameter_names(cls) -> tuple[str, ...]:
        """The trigger's parameters but ``last_look``: the sensor fills that in from its own look."""
        return tuple(name for name in super().wait_parameter_names() if name != "last_look")

    def trigger_params(self) -> dict[str, Any]:
        """The wait's kwargs, with what the last look in this worker saw handed over.

        A trigger for the next poke gets the keys themselves (it runs here, in memory); a trigger
        for the triggerer gets their fingerprint and count instead, so the kwargs stay small, and
        with ``allow_delete=False`` a short digest of each key, so a key replaced by another
        between this look and the trigger's first listing fails the task, as officially.
        """
        params = super().trigger_params()
        look: dict[str, Any] | None = getattr(self, "_last_look", None)
        if look is not None:
            if getattr(self, "_for_poke", False):
                params["previous_objects"] = self._last_keys
                params["last_look"] = {"observed_at": look["observed_at"], "changed_at": look["changed_at"]}
            else:
                params["previous_objects"] = None
                params["last_look"] = look
        return params

    def _poll_in_worker(self) -> dict[str, Any] | None:
        """One look through the trigger's own check, keeping what it saw for the next look."""
        self._for_poke = True
        try:
            trigger = self.build_trigger(deadline=None)
        finally:
            self._for_poke = False
        assert isinstance(trigger, S3KeysUnchangedTrigger)
        if getattr(self, "_last_look", None) is not None:
            trigger.continue_watch()  # the previous poke of this task: no hand-over between processes
        payload = asyncio.run(trigger.poll_once())
        look = trigger.look()
        if look is not None:
            self._last_look = look
            self._last_keys = trigger.seen_keys()
        return payload


def _key_list(keys: Collection[str] | None) -> list[str] | None:
    """The official ``previous_objects`` (a set) as the sorted list the trigger's JSON kwargs take."""
    if keys is None:
        return None
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Collection):
        raise ValueError(f"previous_objects must be a set or list of keys, got {keys!r}")
    return sorted(keys) if all(isinstance(key, str) for key in keys) else list(keys)
