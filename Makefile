# ElasticJob operator: `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
WHEELS ?= ../shared/wheels
TORCH_VERSION ?= 2.13.0
KUBECONFIG_LOCAL := $(CURDIR)/.localcluster/kubeconfig

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

install: $(VENV)/.installed ## Create .venv with the operator, torch (CPU build from $(WHEELS)) and test tools

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --find-links $(WHEELS) "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@
