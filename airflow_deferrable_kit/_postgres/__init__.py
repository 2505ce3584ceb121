"""asyncpg behind the Postgres waits: the client and the engines that let waits share it.

One job per module; each imports only the modules listed above it:

* ``values``: JSON values <-> asyncpg values (bound arguments in, rows out).
* ``client``: an Airflow ``postgres`` connection -> frozen ``PostgresOptions`` (``load_options``),
  the pool per connection (``open_pool(options)`` / ``close_pool``), asyncpg's errors -> ours
  (``classify_postgres_error``).
* ``listener``: one ``LISTEN`` connection per (connection, channel) to wake waits early.
* ``batches``: one statement per round for every wait of a shape, on the connection's pool
  (``open_batches(options)`` / ``close_batches``).
"""
