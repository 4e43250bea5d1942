# Quick start: `make run` (set up, run the default study) and `make test` (set up, run the tests).
VENV ?= .venv
PYTHON := $(VENV)/bin/python

.PHONY: setup setup-test run test lint docs
setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

$(VENV)/.installed: envs/bootstrap.sh envs/requirements.txt pyproject.toml
	bash envs/bootstrap.sh $(VENV)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed envs/requirements-test.txt
	bash envs/bootstrap.sh $(VENV) --test
	touch $@

run: setup
	$(VENV)/bin/snakemake -c all

# Two workers, each taking whole test files (a file's fixtures are built once): the suite's SLURM and
# end-to-end tests mostly wait on processes, so two keep a two-core machine busy. PYTEST_WORKERS=0: one.
PYTEST_WORKERS ?= 2
test: setup-test
	$(PYTHON) -m pytest -n $(PYTEST_WORKERS) --dist loadfile

lint: setup-test
	$(VENV)/bin/ruff check src tests bench tools
	$(VENV)/bin/snakemake --lint
	$(VENV)/bin/snakefmt --check Snakefile workflow/rules
	$(PYTHON) -m trainbench schema --check workflow/schemas/config.schema.yaml

# The documentation site (docs/, mkdocs.yml) into site/, every warning an error: a broken link or anchor
# fails the build.
docs: setup-test
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
