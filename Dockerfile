# The gpufold image: the CLI with the PostgreSQL projections and the HTTP API.
# docker-compose.yml runs it as the processor, the projector and the api; by itself it runs the processor.
#
# Two stages: `build` (the full python image, which has gcc) installs gpufold into /install, compiling the
# hot path with mypyc (GPUFOLD_COMPILE=1; opt-in on a developer machine, see README "The compiled hot path");
# the slim runtime image copies only the installed files. Both stages are the same CPython 3.11 build, so
# the compiled extension modules load unchanged. Without a compiler the install keeps pure Python (same
# bytes, slower) and says so in the build log.
FROM python:3.11 AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml setup.py build_config.py README.md ./
COPY gpufold ./gpufold
COPY kafka_settings ./kafka_settings
COPY logs ./logs
COPY processor ./processor
COPY producers ./producers
COPY projections ./projections
COPY schemas ./schemas
RUN GPUFOLD_COMPILE=1 pip install --prefix=/install ".[postgres,api]" \
    && PYTHONPATH=/install/lib/python3.11/site-packages python -c \
       'import build_config; print("gpufold:", build_config.summary())'

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

COPY --from=build /install /usr/local
RUN useradd --system --uid 10001 --no-create-home gpufold

USER gpufold
EXPOSE 8000
CMD ["gpufold", "processor", "run", "--bootstrap", "kafka:9092"]
