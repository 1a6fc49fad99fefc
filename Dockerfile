# The gpufold image: the CLI with the PostgreSQL projections and the HTTP API.
# docker-compose.yml runs it as the processor, the projector and the api; by itself it runs the processor.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# setup.py compiles the hot path with mypyc when a C compiler is there; this slim image has none, so the
# install says so and keeps pure Python (same bytes, slower; see README "The compiled hot path").
COPY pyproject.toml setup.py README.md ./
COPY gpufold ./gpufold
COPY kafka_settings ./kafka_settings
COPY processor ./processor
COPY producers ./producers
COPY projections ./projections
COPY schemas ./schemas
RUN pip install ".[postgres,api]" \
    && useradd --system --uid 10001 --no-create-home gpufold

USER gpufold
EXPOSE 8000
CMD ["gpufold", "processor", "run", "--bootstrap", "kafka:9092"]
