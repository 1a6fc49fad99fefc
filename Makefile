# Two commands do all the set-up on a fresh machine:
#   make demo   - installs into .venv and replays the bundled openb trace on the embedded log
#   make test   - installs, starts Kafka and PostgreSQL, runs every test, stops them
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test unit lint typecheck bench services services-stop clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,postgres,api,plot]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpufold demo

test: $(STAMP)
	bash scripts/test.sh

unit: $(STAMP)
	$(PY) -m pytest -m 'not integration'

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/fold_throughput.py

services: $(STAMP)
	bash scripts/kafka.sh start
	bash scripts/postgres.sh start

services-stop:
	-bash scripts/kafka.sh stop
	-bash scripts/postgres.sh stop

clean: services-stop
	rm -rf $(VENV) .services .pytest_cache .hypothesis
