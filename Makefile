# Two commands do all the set-up on a fresh machine:
#   make demo   - installs into .venv, replays the bundled openb trace on the embedded log, serves the dashboard
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
	@# pip shows the build's messages only with -v: say here whether the hot path was compiled (setup.py)
	@$(PY) -c 'import build_config; print("== gpufold:", build_config.summary())'
	touch $(STAMP)

DEMO_PORT ?= 8000

demo: $(STAMP)
	$(VENV)/bin/gpufold demo
	@echo
	@echo "== dashboard: open http://127.0.0.1:$(DEMO_PORT)/ in a browser (API docs at /docs); Ctrl-C stops it"
	$(VENV)/bin/gpufold serve --log gpufold-demo.sqlite --database-url sqlite:///gpufold-demo.projections.sqlite --port $(DEMO_PORT)

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
