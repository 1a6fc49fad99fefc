"""The logs: the port a processor and a replica use to read and write a log of commands, and its two backends.

- :mod:`logs.port`: :class:`~logs.port.CommandLog`, :class:`~logs.port.ReplicaSource` and the records they pass
  (:class:`~logs.port.InputRecord`, :class:`~logs.port.OutputRecord`, :class:`~logs.port.StoredRecord`);
- the embedded backend (one SQLite file, no servers): :mod:`logs.embedded` (the log), :mod:`logs.embedded_format`
  (its tables, checksums and errors), :mod:`logs.embedded_reader` (the one checked reader of a topic, which the
  projector and the replica read through), :mod:`logs.embedded_replica` (the replica's source);
- the Kafka backend: :mod:`logs.kafka` (exactly-once with transactions), :mod:`logs.fair_batch` (fair batches
  across partitions), :mod:`logs.kafka_reader` (the one reader of a Kafka topic: the projector's events, the
  replica's commands and snapshots, ``gpufold log export --bootstrap``), :mod:`logs.kafka_replica` (the
  replica's group-less source).

Nothing outside this package reads the embedded log's tables or opens a Kafka client on the logs' topics to
fold or project them (``tests/unit/test_import_rules.py``). Importing ``logs`` alone loads neither SQLite nor Kafka.
"""
