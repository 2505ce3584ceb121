"""Wait for S3 objects without holding a worker slot."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from airflow.sdk import Context

from airflow_deferrable_kit.sensors.base import DeferrableSensor, OfficialRefusal, unless_default
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger


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
        "region_name": unless_default("set 'region_name' in the extras of the aws connection", None),
        "region": unless_default("set 'region_name' in the extras of the aws connection", None),
        "botocore_config": unless_default(
            "set botocore options in the extra 'config_kwargs' of the aws connection", None
        ),
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

    def trigger_params(self) -> dict[str, Any]:
        params = super().trigger_params()
        if isinstance(params["bucket_key"], tuple):
            params["bucket_key"] = list(params["bucket_key"])
        return params
