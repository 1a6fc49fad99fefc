"""gpufold: an event-sourced GPU scheduler. The CLI, the embedded log and the trace tools live here;
the fold is in ``processor``, the Avro contract in ``schemas``."""

__version__ = "0.1.0"
