"""aiokafka behind the Kafka waits: the client's door, its settings, and the shared reader's engine.

The trigger side asks two modules: ``client`` (the door every client package has) and
``subscription`` (one wait's view of the shared reader, asked by verbs). One job per module;
each imports only the modules listed above it:

* ``settings``: an Airflow ``kafka`` connection -> ``KafkaOptions`` (``load_options``), and every
  per-process tunable of the engine below.
* ``gate``: one paced connection gate per (connection, broker), so an outage is retried once.
* ``consumers``: aiokafka's consumers and admin clients started scoped and safely, its errors ->
  ours (``classify_kafka_error``), every private-API use fenced.
* ``offsets``: where a wait starts and what it may commit (start, log-end and committed offsets).
* ``lookups``: the offset lookups of many waits, gathered and asked together.
* ``messages``: a record decoded once for every waiter, and a wait's condition with its index.
* ``fanout``: the hand-out: waiters, their index, and the topics they read (``TopicReader``).
* ``catchup``: late waits brought up to the shared reader by catch-up passes, or read at their
  own pace.
* ``reader``: ``ConnectionReader``, one fetch consumer per connection per process.
* ``stream``: the read behind a Kafka event trigger's shared stream.
* ``subscription``: one wait's view of the shared reader: join, start, next match, catch up,
  scan (the poke path), leave.
* ``client``: the door: ``load_options``, ``open_reader`` / ``close_reader`` (the shared reader),
  ``classify_kafka_error``.
"""
