# The two commands in the README: `make serve` (start the standalone runtime) and `make test` (the whole suite).
# Both install what they need first (scripts/setup.sh), so a fresh machine needs nothing else.
PY := .venv/bin/python

.PHONY: serve test bench mutate setup setup-dev lint

serve: setup
	$(PY) -m standalone.cli serve $(ARGS)

test: setup-dev lint
	$(PY) -m pytest $(ARGS)

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: setup-dev
	$(PY) -m bench $(ARGS)

# Mutation testing (not part of `make test`): every mutant of each module against the tests that cover it.
# make mutate [MODULES="src/durable/retention.py ..."] [TESTS="tests/unit/test_retention.py ..."] [JOBS=N]
mutate: setup-dev
	$(PY) scripts/mutate.py $(MODULES) $(if $(TESTS),--tests $(TESTS)) $(if $(JOBS),--jobs $(JOBS))

setup:
	scripts/setup.sh runtime

setup-dev:
	scripts/setup.sh dev
