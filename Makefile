# The two entry points: `make demo` runs the main job, `make test` runs every check and test.
# Expensive things live in a cache outside the checkout, keyed by version, so warm runs are fast.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CLOUDNET_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cloudnet
RUST_TOOLCHAIN := $(shell sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
CARGO_TARGET_DIR ?= $(CLOUDNET_CACHE_DIR)/target/rust-$(RUST_TOOLCHAIN)
export CLOUDNET_CACHE_DIR CARGO_TARGET_DIR

.PHONY: help demo test controlplane moto

help:
	@echo "make demo   run the main job: control plane, EC2 (moto), webhook, reconciler (Ctrl-C stops)"
	@echo "make test   run formatting, lint and every test"

## Builds kube-apiserver, etcd and kubectl into the cache (once).
controlplane:
	@e2e-kind/controlplane/build.sh >/dev/null

## Installs moto's EC2 server into a Python venv in the cache (once).
moto:
	@e2e-kind/moto/venv.sh >/dev/null

demo: controlplane moto
	@cargo build --locked --quiet -p cloudnet-webhook -p cloudnet-reconciler
	@cargo run --locked --quiet -p cloudnet-e2e --bin cloudnet-demo

test: controlplane moto
	cargo fmt --all --check
	cargo clippy --locked --workspace --all-targets -- -D warnings
	cargo build --locked -p cloudnet-webhook -p cloudnet-reconciler # the e2e suite runs these binaries
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_MOTO_VENV="$$(e2e-kind/moto/venv.sh)" cargo test --locked --workspace

.PHONY: bench-reconciler
## Reconciler benchmark (not a test): 1,000 objects over 100 nodes, memory cloud at 50 ms per call,
## the reconciler (benchmark profile: release with the idle EC2 SDK unoptimised) as its own process.
## Pass BENCH_ARGS="10000 1000" for the memory-scale run; BENCH_COALESCE_MS,
## BENCH_CONCURRENT_RECONCILES and BENCH_FLOOR=0 are described in e2e-kind/src/bin/bench-reconciler.rs.
## JSON lands in $(CLOUDNET_CACHE_DIR)/bench/.
bench-reconciler: controlplane
	cargo build --profile benchmark --locked --quiet -p cloudnet-reconciler --bin cloudnet-reconciler
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	cargo run --profile benchmark --locked --quiet -p cloudnet-e2e --bin bench-reconciler -- $(BENCH_ARGS)

.PHONY: bench-webhook
## Webhook load benchmark (not a test): 1,000 nodes and 10,000 objects in its caches, keep-alive TLS
## load on /validate and /mutate. BENCH_DURATION_SECS, BENCH_CONNECTIONS tune it. JSON lands in
## $(CLOUDNET_CACHE_DIR)/bench/.
bench-webhook: controlplane
	cargo build --profile benchmark --locked --quiet -p cloudnet-webhook
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_WEBHOOK_BIN="$(CARGO_TARGET_DIR)/benchmark/cloudnet-webhook" \
	cargo run --profile benchmark --locked --quiet -p cloudnet-e2e --bin bench-webhook

.PHONY: e2e
## The end-to-end suite alone: control plane, moto behind the fault proxy, webhook and reconciler
## as separate processes. CLOUDNET_E2E_KUBECONFIG (+ CLOUDNET_E2E_EC2_URL) targets a cluster.
e2e: controlplane moto
	cargo build --locked -p cloudnet-webhook -p cloudnet-reconciler
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_MOTO_VENV="$$(e2e-kind/moto/venv.sh)" cargo test --locked -p cloudnet-e2e --test 'e2e_*'
