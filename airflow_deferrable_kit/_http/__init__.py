"""aiohttp behind the HTTP waits.

* ``client``: an Airflow ``http`` connection -> a request target (``load_options``), the shared
  session (``open_session`` / ``close_session``), capped reads, shared identical requests, and
  aiohttp's errors -> ours (``classify_aiohttp_error``).
"""
