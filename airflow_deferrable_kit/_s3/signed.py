"""The fast path of an S3 poll: HEAD and ListObjectsV2 requests signed and sent directly.

A poll through botocore's full path spends most of its CPU in per-request machinery (event
hooks, endpoint rules, serialization, response parsing). :class:`DirectRequests` skips it while
answering exactly as botocore would: the endpoint (host, path or virtual-host addressing,
signing region) comes from botocore's endpoint rules once per operation and bucket, each request
is signed by botocore's SigV4 signer with the client's current credentials and sent by the
client's own HTTP session, and a listing page's XML is read with ElementTree directly. A
response comes back as what botocore would parse, or as the ``ClientError`` botocore would raise
for it, so errors are classified the same way.

Anything else goes through botocore unchanged: a bucket whose rules ask for another signer (S3
Express, multi-region access points), a configured ``signature_version``, and a request answered
by a redirect or a bare 400 (a bucket in another region), which botocore's region redirector
then follows. The botocore internals this needs are fenced in :mod:`airflow_deferrable_kit._s3.client`.

A request is signed only once one of the pool's connections is free for it (:attr:`DirectRequests.slots`):
when the server answers more slowly than the waits poll, the polls queue as bare coroutines
instead of as thousands of signed requests, each with its headers and aiohttp's request objects,
waiting in the connector's queue (and a signature is never minutes old when it is sent).
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import urllib.parse
from collections.abc import Mapping
from typing import Any, Final

from airflow_deferrable_kit._s3.client import resolve_sigv4_endpoint, send_signed, user_agent

#: Statuses handed over to botocore, whose region redirector recognises a bucket that lives in
#: another region by them (a request signed for the wrong region gets a redirect or a 400).
_REDIRECT_STATUSES: Final = frozenset({301, 302, 307, 400})


@dataclasses.dataclass(frozen=True)
class _Route:
    """Where a bucket's requests go and how they are signed, as botocore's endpoint rules say."""

    base_url: str  # the bucket's URL without a trailing slash: objects are under it
    region: str

    @property
    def bucket_url(self) -> str:
        """The URL bucket-level requests go to (``…/bucket`` path style, ``https://bucket.host/``)."""
        return self.base_url if urllib.parse.urlsplit(self.base_url).path else self.base_url + "/"


_UNRESOLVED: Final = object()


class DirectRequests:
    """HEAD and listing pages of one client, sent directly where botocore's own path is not needed."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._routes: dict[tuple[str, str], Any] = {}
        self._user_agent = user_agent(client)
        #: One per connection of the client's pool: a request is built and signed once it holds one.
        self.slots = asyncio.Semaphore(max(1, int(getattr(client.meta.config, "max_pool_connections", 10) or 10)))

    # ---------------------------------------------------------------------------- HEAD
    async def head_object(self, bucket: str, key: str) -> dict[str, Any] | None:
        """``ContentLength``, ``ETag`` and ``LastModified`` of an object, as botocore parses them.

        ``None`` when S3 answers 404: the usual answer of a poll, so it builds no exception.
        """
        from botocore.utils import parse_timestamp, percent_encode

        route = await self._route("HeadObject", bucket)
        if route is None:
            return await self._botocore_head(bucket, key)
        response = await self._send(route, "HEAD", f"{route.base_url}/{percent_encode(key, safe='/~')}")
        status, headers = response.status_code, response.headers
        if status == 404:
            return None
        if status < 300:
            length, modified = headers.get("content-length"), headers.get("last-modified")
            return {
                "ContentLength": int(length) if length is not None else None,
                "ETag": headers.get("etag"),
                "LastModified": parse_timestamp(modified) if modified is not None else None,
            }
        if status in _REDIRECT_STATUSES:
            self._routes.pop(("HeadObject", bucket), None)  # resolved again, with what botocore learns
            return await self._botocore_head(bucket, key)
        raise _client_error(status, headers, b"", "HeadObject")

    async def _botocore_head(self, bucket: str, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            return dict(await self.client.head_object(Bucket=bucket, Key=key))
        except ClientError as exc:
            if (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") == 404:
                return None
            raise

    # ------------------------------------------------------------------------- listings
    async def list_page(
        self, bucket: str, prefix: str, token: str | None, keys: list[str], details: list[tuple[Any, Any, Any]]
    ) -> str | None:
        """Append one ``ListObjectsV2`` page's objects to ``keys``/``details``; return the next page's token."""
        from botocore.utils import percent_encode_sequence

        route = await self._route("ListObjectsV2", bucket)
        if route is not None:
            query = [("list-type", "2"), ("prefix", prefix)]
            if token is not None:
                query.append(("continuation-token", token))
            query.append(("encoding-type", "url"))
            response = await self._send(route, "GET", f"{route.bucket_url}?{percent_encode_sequence(query)}")
            status = response.status_code
            if status < 300:
                return _read_page(await response.content, keys, details)
            if status not in _REDIRECT_STATUSES:
                raise _client_error(status, response.headers, await response.content, "ListObjectsV2")
            self._routes.pop(("ListObjectsV2", bucket), None)  # resolved again, with what botocore learns
        request = {"Bucket": bucket, "Prefix": prefix}
        if token is not None:
            request["ContinuationToken"] = token
        page = await self.client.list_objects_v2(**request)
        for item in page.get("Contents") or ():
            keys.append(item["Key"])
            details.append((item.get("Size"), item.get("ETag"), item.get("LastModified")))
        following = page.get("NextContinuationToken")
        return following if page.get("IsTruncated") and following else None

    # -------------------------------------------------------------------------- requests
    async def _route(self, operation_name: str, bucket: str) -> _Route | None:
        """How requests of ``operation_name`` in ``bucket`` go; ``None``: through botocore's full path.

        Resolved once per operation and bucket, by botocore's endpoint rules (the same answer
        for every key: the rules do not look at keys or prefixes).
        """
        route = self._routes.get((operation_name, bucket), _UNRESOLVED)
        if route is _UNRESOLVED:
            route = self._routes[operation_name, bucket] = await self._resolve(operation_name, bucket)
        return route

    async def _resolve(self, operation_name: str, bucket: str) -> _Route | None:
        endpoint = await resolve_sigv4_endpoint(self.client, operation_name, bucket)
        if endpoint is None:
            return None
        url, region = endpoint
        return _Route(base_url=url[:-1] if url.endswith("/") else url, region=region)

    async def _send(self, route: _Route, method: str, url: str) -> Any:
        """Sign and send once a pool connection is free; the response's headers are read, its body is not."""
        async with self.slots:
            return await send_signed(self.client, method, url, region=route.region, agent=self._user_agent)


def _local(tag: str) -> str:
    """An XML tag without its namespace."""
    return tag.rpartition("}")[2]


def _read_page(body: bytes, keys: list[str], details: list[tuple[Any, Any, Any]]) -> str | None:
    """Append the objects of one ``ListBucketResult`` page; return its continuation token, if any."""
    from xml.etree import ElementTree

    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        from botocore.parsers import ResponseParserError  # what botocore raises for the same body

        raise ResponseParserError(f"unreadable ListObjectsV2 response ({exc}): {body[:120]!r}") from exc
    ns = root.tag[: -len(_local(root.tag))]
    decode = urllib.parse.unquote_plus if root.findtext(f"{ns}EncodingType") == "url" else None
    for item in root.iterfind(f"{ns}Contents"):
        key = item.findtext(f"{ns}Key") or ""
        size = item.findtext(f"{ns}Size")
        keys.append(decode(key) if decode else key)
        details.append(
            (int(size) if size else None, item.findtext(f"{ns}ETag"), item.findtext(f"{ns}LastModified") or None)
        )
    token = root.findtext(f"{ns}NextContinuationToken")
    return token if root.findtext(f"{ns}IsTruncated") == "true" and token else None


def _client_error(status: int, headers: Mapping[str, str], body: bytes, operation_name: str) -> Exception:
    """The ``ClientError`` botocore raises for an S3 error response: the code from the XML body,
    or, without one (every HEAD error), the HTTP status as the code."""
    from xml.etree import ElementTree

    from botocore.exceptions import ClientError

    error = {"Code": str(status), "Message": http.client.responses.get(status, "")}
    metadata: dict[str, Any] = {
        "RequestId": headers.get("x-amz-request-id", ""),
        "HostId": headers.get("x-amz-id-2", ""),
    }
    if body:
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            root = None
        if root is not None and _local(root.tag) == "Error":
            fields = {_local(child.tag): child.text or "" for child in root}
            metadata["RequestId"] = fields.pop("RequestId", metadata["RequestId"])
            metadata["HostId"] = fields.pop("HostId", metadata["HostId"])
            error = {**error, **fields}
    metadata.update(HTTPStatusCode=status, HTTPHeaders=dict(headers), RetryAttempts=0)
    return ClientError({"Error": error, "ResponseMetadata": metadata}, operation_name)
