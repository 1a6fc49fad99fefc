"""``gpufold serve``: one FastAPI app for the operator.

It composes, in ``gpufold.server.app``: the projections' read API (``projections.api``, when a
database is given), the live replica's routes (``replica_routes``: pods, nodes, explain, what-if,
the dashboard's data), the write API (``write_routes``: ``POST /v1/commands`` and typed routes,
publishing through ``producers.CommandPublisher`` on Kafka or appending to the embedded log), and
the dashboard page at ``/`` (``dashboard/``, plain HTML and JavaScript, no build step).
"""
