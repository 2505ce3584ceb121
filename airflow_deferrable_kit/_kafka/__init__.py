"""aiokafka behind the Kafka waits: the client, its settings, and the shared reader's engine.

One job per module; each imports only the modules listed above it:

* ``settings``: an Airflow ``kafka`` connection -> aiokafka options (``load_options``), and every
  per-process tunable of the engine below.
* ``gate``: one paced connection gate per (connection, broker), so an outage is retried once.
* ``client``: consumers and admin clients started scoped and safely, aiokafka's errors -> ours
  (``classify_kafka_error``), every private-API use fenced.
* ``offsets``: where a wait starts and what it may commit (start, log-end and committed offsets).
* ``lookups``: the offset lookups of many waits, gathered and asked together.
* ``messages``: a record decoded once for every waiter, and a wait's condition with its index.
* ``fanout``: the hand-out: waiters, the topics they read (``TopicReader``) and catch-up passes.
* ``catchup``: late waits brought up to the shared reader, or read at their own pace.
* ``reader``: ``ConnectionReader``, one fetch consumer per connection per process.
* ``stream``: the read behind a Kafka event trigger's shared stream.
"""
