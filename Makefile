# The two commands in the README: `make serve` (start the standalone runtime) and `make test` (the whole suite).
# Both install what they need first (scripts/setup.sh), so a fresh machine needs nothing else.
PY := .venv/bin/python

.PHONY: serve test bench setup setup-dev lint

serve: setup
	$(PY) -m standalone.cli serve $(ARGS)

test: setup-dev lint
	$(PY) -m pytest $(ARGS)

lint:
	$(PY) -m ruff check .

bench: setup-dev
	$(PY) -m bench $(ARGS)

setup:
	scripts/setup.sh runtime

setup-dev:
	scripts/setup.sh dev
