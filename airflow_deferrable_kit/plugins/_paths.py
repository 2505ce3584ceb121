"""Where the Waits page lives: its mount prefix, its UI route, and the deployment's base path."""

from __future__ import annotations

from urllib.parse import urlparse

#: Where the app is mounted on the api-server (outside the prefixes Airflow reserves).
URL_PREFIX = "/deferrable-kit"
#: The UI route of the nav entry: ``<base>/plugin/waits``.
URL_ROUTE = "waits"


def base_path() -> str:
    """The path part of ``[api] base_url`` (``""`` at the root), which every link starts with."""
    try:
        from airflow.configuration import conf

        base_url = conf.get("api", "base_url", fallback="/") or "/"
    except Exception:  # a broken config must not break loading the plugin anywhere
        base_url = "/"
    path = urlparse(base_url).path if base_url.startswith(("http://", "https://")) else base_url
    return path.rstrip("/")
