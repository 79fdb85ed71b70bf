# ElasticJob operator: `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
WHEELS ?= ../shared/wheels
TORCH_VERSION ?= 2.13.0
NODES ?= 3
KUEUE ?= 0
SCHEDULER_PLUGINS ?= 0
KWOK ?= 0
REAL_NODES ?= 1
# The Kubernetes release of the local cluster: empty, the one localcluster/go.mod pins (v1.36.3); else a supported
# minor (1.33 to 1.37: its newest patch, in build.sh's table) or a full version (1.33.5). Every recipe, and each
# `localcluster up` and test it starts, builds (once, cached per version) and runs that release's binaries.
K8S_VERSION ?= $(ELASTICJOB_K8S_VERSION)
export ELASTICJOB_K8S_VERSION := $(K8S_VERSION)
# That release's kubectl (built with the control plane) ahead of any other on PATH, for recipes and their tests.
KUBE_BIN := $(shell ELASTICJOB_K8S_VERSION=$(K8S_VERSION) bash localcluster/build.sh --bin-dir 2>/dev/null)
$(if $(KUBE_BIN),,$(error K8S_VERSION=$(K8S_VERSION): $(shell ELASTICJOB_K8S_VERSION=$(K8S_VERSION) bash localcluster/build.sh --bin-dir 2>&1)))
export PATH := $(KUBE_BIN):$(PATH)

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

install: $(VENV)/.installed ## Create .venv with the operator, the local cluster (localcluster/pyproject.toml), torch (CPU build from $(WHEELS)) and test tools

# Two distributions, both editable: the operator (its wheel is what the operator's image installs) and the local
# cluster, the demo and its story (elasticjob-localcluster).
$(VENV)/.installed: pyproject.toml localcluster/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --find-links $(WHEELS) "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -e ".[dev]" -e localcluster
	touch $@

crds: $(VENV)/.installed ## Regenerate crds/ and the chart's CRD from the pydantic models
	$(VENV)/bin/elasticjob crd > crds/elasticjob.dev_elasticjobs.yaml
	cp crds/elasticjob.dev_elasticjobs.yaml charts/elasticjob-operator/crds/elasticjob.dev_elasticjobs.yaml

pod-schema: $(VENV)/.installed ## Regenerate spec.template's schema (operator/elasticjob/pod_template_schema.json) from the OpenAPI of the newest supported Kubernetes release (build.sh's table; Go module cache), then the CRDs
	version=$$(grep -o '\[1\.[0-9]*\]=v[0-9.]*' localcluster/build.sh | cut -d= -f2 | sort -V | tail -1) && \
	dir=$$(go -C localcluster mod download -json k8s.io/kubernetes@$$version | $(PY) -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') && \
	$(PY) -m elasticjob.podschema "$$dir" > operator/elasticjob/pod_template_schema.json
	$(MAKE) crds

lint: $(VENV)/.installed ## ruff (pyproject.toml's rules), mypy (strict, the operator) and the import layers (controller -> planner -> models)
	$(VENV)/bin/ruff check operator localcluster/localcluster tests bench charts
	$(VENV)/bin/mypy -p elasticjob
	$(VENV)/bin/mypy --python-version 3.10 -p elasticjob_store -p elasticjob_warm -p elasticjob_kit -p elasticjob_ckpt -p elasticjob_progress
	$(VENV)/bin/lint-imports

# actionlint, built from its Go module into a cache path keyed by its version (as localcluster/build.sh builds
# CoreDNS), once; the cache is build.sh's ($ELASTICJOB_CACHE, else ~/.cache/elasticjob).
ACTIONLINT_VERSION ?= v1.7.12
TOOLS_CACHE := $(or $(ELASTICJOB_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/elasticjob)
ACTIONLINT := $(TOOLS_CACHE)/actionlint-$(ACTIONLINT_VERSION)/bin/actionlint

$(ACTIONLINT):
	@command -v go >/dev/null || { echo "the Go toolchain (go) is needed to build actionlint" >&2; exit 1; }
	@echo "building actionlint $(ACTIONLINT_VERSION) into $(@D) (first time only; about 25 s on 2 cores with cold Go caches)" >&2
	CGO_ENABLED=0 GOBIN=$(@D) go install -trimpath -ldflags "-s -w" github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)

# kind, pinned, built the same way; its node image is built here by tests/e2e/kind/node-image.sh (kindest/node
# cannot be pulled on a machine without Docker Hub).
KIND_VERSION ?= v0.33.0
KIND_BIN := $(TOOLS_CACHE)/kind-$(KIND_VERSION)/bin/kind

$(KIND_BIN):
	@command -v go >/dev/null || { echo "the Go toolchain (go) is needed to build kind" >&2; exit 1; }
	@echo "building kind $(KIND_VERSION) into $(@D) (first time only)" >&2
	CGO_ENABLED=0 GOBIN=$(@D) go install -trimpath -ldflags "-s -w" sigs.k8s.io/kind@$(KIND_VERSION)

kind-tool: $(KIND_BIN) ## Build kind (KIND_VERSION) from its Go module into ~/.cache/elasticjob, once; prints its path
	@echo $(KIND_BIN)

# Not in `lint` (its first run needs Go and the module proxy, and shellcheck is a Debian package: root to
# install); `test` runs it, after host-packages, as it already needs both.
lint-workflows: $(ACTIONLINT) ## actionlint (ACTIONLINT_VERSION, built once into ~/.cache/elasticjob) on .github/workflows/*.yml, shellcheck on each run: step
	@command -v shellcheck >/dev/null || { echo "lint-workflows: shellcheck is missing (actionlint checks run: steps with it); \`make host-packages\` installs it" >&2; exit 1; }
	$(ACTIONLINT) .github/workflows/*.yml

# make test's cluster tiers in two sessions on one cluster: the integration tests that share it (each in its own
# namespace, with its own operator) two at a time, then alone the ones that change what every test sees
# (marked alone), the core e2e scenarios (training sized to the nodes) and the short soak.
SHARED_TESTS := integration and not alone and not slow and not process_nodes
ALONE_TESTS := not (integration and not alone) and not slow and not process_nodes

test: $(VENV)/.installed lint cluster-build host-packages lint-workflows ## Unit tests (both cores), then on one local cluster of real nodes: integration tests (the operator against the real API server; those that share the cluster two at a time), the core e2e scenarios (real torchrun training) and the short soak; each part's slowest tests listed
	@status=0; running=0; \
	$(PY) -m pytest tests/unit -n 2 -p no:cacheprovider --durations=10 || status=$$?; \
	$(VENV)/bin/localcluster status >/dev/null 2>&1 && running=1; \
	KEEP_CLUSTER=1 $(PY) -m pytest tests/integration -m "$(SHARED_TESTS)" -n 2 -p no:cacheprovider --durations=15 || status=$$?; \
	KEEP_CLUSTER=1 $(PY) -m pytest tests -m "$(ALONE_TESTS)" --ignore=tests/unit -p no:cacheprovider --durations=25 || status=$$?; \
	if [ $$running = 0 ] && [ "$$KEEP_CLUSTER" != 1 ]; then $(VENV)/bin/localcluster down; fi; \
	exit $$status

test-process-nodes: $(VENV)/.installed ## Opt-in, not in `make test`: the process-backed node agent's own tests, on a local cluster of its nodes (the fleet benchmark's light pods still run on them)
	LOCALCLUSTER_NODE_KIND=process $(PY) -m pytest tests -m process_nodes -p no:cacheprovider

host-packages: ## Install (as root, where missing) the Debian packages real nodes, image builds and lint-workflows need: containerd, runc, CNI plugins, buildah, mmdebstrap, shellcheck
	bash localcluster/host-packages.sh

test-unit: $(VENV)/.installed ## Unit tests only (no cluster; about 7 minutes, on both cores)
	$(PY) -m pytest tests/unit -n 2 -p no:cacheprovider

e2e: $(VENV)/.installed host-packages ## Every e2e scenario, slow ones included, on real nodes (E2E_CLUSTER=kind runs them on kind)
ifeq ($(E2E_CLUSTER),kind)
	bash tests/e2e/kind/up.sh
	E2E_CLUSTER=kind KUBECONFIG=$(CURDIR)/.kind/kubeconfig $(PY) -m pytest tests/e2e -p no:cacheprovider
else
	$(PY) -m pytest tests/e2e -p no:cacheprovider
endif

compat: ## Opt-in, not in `make test`: rendezvous scenarios vs each torch (VERSIONS=2.7.1,2.13.0), local processes; venvs cached in ~/.cache/elasticjob/compat (PyPI's CUDA builds: about 3 GB and 5-7 GB each)
	python3 tests/compat/run.py --markdown $(if $(VERSIONS),--versions $(VERSIONS))

compat-k8s: $(VENV)/.installed host-packages ## Opt-in, not in `make test`: the core e2e scenarios (plain, kill, scale, Kueue queue and slice) on real nodes of each Kubernetes minor (VERSIONS=1.33,1.37), a table
	$(PY) tests/compat/k8s.py --markdown $(if $(VERSIONS),--versions $(VERSIONS))

gpu-check: ## Opt-in, on a machine with a CUDA GPU and its torch: warm starts on the GPU, the rendezvous scenarios and the store ride-out against that torch, and bench/gpu_restart.py
	bash tests/compat/gpu_check.sh

.PHONY: compat compat-k8s gpu-check

run: $(VENV)/.installed host-packages ## Local cluster on real nodes and its registry (images pushed there), the chart pushed there and installed as oci://, every image pulled with a pull secret; examples/elasticjob.yaml grown and broken (SCENARIO=basic: plain run)
	$(PY) -m localcluster.demo $(if $(SCENARIO),--scenario $(SCENARIO))

cluster-build: ## Build (once per K8S_VERSION; progress on stderr) the control plane, kubectl and the add-ons into ~/.cache/elasticjob
	bash localcluster/build.sh >/dev/null
	bash localcluster/build_addons.sh >/dev/null

cluster-up: $(VENV)/.installed ## Start the local cluster ($(NODES) real nodes; REAL_NODES=0 the process-backed agent's instead; KUEUE=1, SCHEDULER_PLUGINS=1, KWOK=1 add those; K8S_VERSION=1.33 another release)
	$(VENV)/bin/localcluster up --nodes $(NODES) $(if $(filter 0,$(REAL_NODES)),--process-nodes) $(if $(filter 1,$(KUEUE)),--kueue) \
		$(if $(filter 1,$(SCHEDULER_PLUGINS)),--scheduler-plugins) $(if $(filter 1,$(KWOK)),--kwok)

cluster-down: $(VENV)/.installed ## Stop the local cluster; leaves no process behind
	$(VENV)/bin/localcluster down

bench: $(VENV)/.installed ## Benchmarks, printed as tables: planner work per event, job size, and a fleet of jobs vs a bare client
	$(PY) bench/run.py
	$(PY) bench/memory.py
	$(VENV)/bin/localcluster up --nodes $(NODES) --process-nodes --kwok
	$(PY) bench/scale.py
	$(PY) bench/fleet.py

bench-fleet: $(VENV)/.installed ## Only the fleet: 100, 300 and 1,000 jobs on one operator (kwok's fake nodes), vs a bare client
	$(VENV)/bin/localcluster up --nodes $(NODES) --process-nodes --kwok
	$(PY) bench/fleet.py

bench-fleet-scale: $(VENV)/.installed ## 1,000, 3,000 and 10,000 jobs on one operator (kwok) vs a bare client: converge, requests per job, API server load, memory; each run on a kwok cluster started anew, so the local cluster running is stopped (about 75 minutes)
	$(PY) bench/fleet_scale.py --fresh 1000 3000 10000

bench-checkpoint: $(VENV)/.installed ## Checkpoints in memory (elasticjob_ckpt) vs torch.save: the save stall for 1 GiB and the load after a worker kill, medians of RUNS (default 5); local processes, no cluster
	$(PY) bench/checkpoint.py --runs $(or $(RUNS),5)

bench-recovery: $(VENV)/.installed host-packages ## Fault -> next training step, four ways, medians of RUNS (default 5), on real then process-backed nodes (NODE_KINDS); about 55 min per kind
	$(PY) bench/recovery.py --runs $(or $(RUNS),5) --node-kinds $(or $(NODE_KINDS),real,process)

bench-goodput: $(VENV)/.installed host-packages ## ETTR and the ledger's phases under a fault every 2 minutes, three setups (this operator, warmStarts false, torchrun in a StatefulSet) for MINUTES each (default 20; QUICK=1: 4); real nodes and Kueue
	$(VENV)/bin/localcluster up --nodes $(NODES) --real-nodes --kueue
	$(PY) bench/goodput.py $(if $(QUICK),--quick,--minutes $(or $(MINUTES),20))

bench-steps-lost: $(VENV)/.installed host-packages ## Steps lost per scale-down and per eviction, with the progress API's planned stop, with a SIGTERM handler only, and with neither (RUNS, default 3); real nodes
	$(VENV)/bin/localcluster up --nodes $(NODES) --real-nodes
	$(PY) bench/steps_lost.py --runs $(or $(RUNS),3)

bench-unanswered: $(VENV)/.installed host-packages ## False positives of the store's Unanswered evidence: a plain script's job of 3 workers that no fault touches, calm then with the CPUs saturated (LOAD busy processes, default 6), MINUTES a phase (default 4); real nodes
	$(VENV)/bin/localcluster up --nodes $(NODES) --real-nodes
	$(PY) bench/unanswered_load.py --minutes $(or $(MINUTES),4) --load $(or $(LOAD),6)

soak: $(VENV)/.installed host-packages ## Randomized orderings for MINUTES (default 10) on real nodes, two operator replicas on a Lease: 60 kills (mostly the leader), API server and etcd restarts, a lost node
	$(VENV)/bin/localcluster up --nodes $(NODES) --real-nodes
	$(PY) tests/soak/soak.py --minutes $(or $(MINUTES),10) --operator-kills 60

clean: ## Remove the virtualenv and the local cluster's state (not the cached Kubernetes binaries)
	-$(VENV)/bin/localcluster down
	rm -rf $(VENV) .localcluster

.PHONY: help install crds pod-schema lint lint-workflows kind-tool test test-unit test-process-nodes host-packages e2e run cluster-build cluster-up cluster-down bench bench-fleet bench-fleet-scale bench-checkpoint bench-recovery bench-goodput bench-steps-lost bench-unanswered soak clean images release chart e2e-kind e2e-kind-down

# The one version (the chart's appVersion): image tags, chart version and package version agree (test_versions.py).
APP_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/elasticjob-operator/Chart.yaml)

images: ## Build the images, tagged with the chart's appVersion, and push them to the local cluster's registry (buildah; root; `make cluster-up REAL_NODES=1` runs it); with Docker when its daemon answers
	@if docker info >/dev/null 2>&1; then \
	  set -ex; \
	  docker build -f images/operator.Dockerfile -t elasticjob-operator:$(APP_VERSION) .; \
	  docker build -f images/worker-cpu.Dockerfile -t elasticjob-worker:$(APP_VERSION)-cpu -t elasticjob-worker:cpu $(if $(TORCH_INDEX_URL),--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL)) .; \
	  docker build -f images/worker.Dockerfile -t elasticjob-worker:$(APP_VERSION)-cuda -t elasticjob-worker:cuda .; \
	else \
	  echo "no Docker daemon: building with buildah (python -m localcluster.imagebuild) and pushing to the local registry" >&2; \
	  $(PY) -m localcluster.imagebuild --torch-wheels $(WHEELS) --push-local; \
	fi

release: $(VENV)/.installed ## Build, tag and push the images and the chart of VERSION=x.y.z to REGISTRY=host/path (buildah and Helm logins there first; REGISTRY=local: the local cluster's); the chart's image pinned by digest
	@test -n "$(VERSION)" -a -n "$(REGISTRY)" || { echo "usage: make release VERSION=x.y.z REGISTRY=host/path" >&2; exit 2; }
	$(PY) -m localcluster.release --version $(VERSION) --registry $(REGISTRY)

chart: $(VENV)/.installed ## Render and lint the chart with Helm's SDK, check schemas, RBAC, docs table, hadolint
	$(PY) charts/values_table.py
	$(PY) -m pytest tests/unit/test_chart.py tests/unit/test_chart_docs.py tests/unit/test_images.py -p no:cacheprovider

e2e-kind: $(VENV)/.installed $(KIND_BIN) host-packages ## Docker (Debian's, started where missing), kind (KIND_VERSION), its node image built here (KIND_NODE=published: kindest/node), images, chart, then the e2e suite on it
	bash localcluster/container-engine.sh
	KIND=$(KIND_BIN) $(MAKE) e2e E2E_CLUSTER=kind

e2e-kind-down: ## Delete make e2e-kind's kind cluster and the host routes up.sh added (Docker stays running)
	KIND=$(KIND_BIN) bash tests/e2e/kind/down.sh
