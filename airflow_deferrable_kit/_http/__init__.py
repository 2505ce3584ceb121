"""aiohttp behind the HTTP waits.

One job per module; each imports only the modules listed above it:

* ``client``: an Airflow ``http`` connection -> frozen ``HttpOptions`` (``load_options``), the shared
  session (``open_session(options)`` / ``close_session``), aiohttp's errors and error statuses ->
  ours (``classify_aiohttp_error``, ``is_transient_status``, ``status_error_type``).
* ``responses``: one request and its response (``send``): read capped, redirects followed with
  the credentials kept to their origin, identical requests sharing one response (``send_shared``).
"""
