# The two entry points: `make demo` runs the main job, `make test` runs every check and test.
# Expensive things live in a cache outside the checkout, keyed by version, so warm runs are fast.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CLOUDNET_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cloudnet
# Where `make images` puts the OCI archives and the cluster tier reads them.
CLOUDNET_IMAGES_DIR ?= $(CLOUDNET_CACHE_DIR)/images
RUST_TOOLCHAIN := $(shell sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
CARGO_TARGET_DIR ?= $(CLOUDNET_CACHE_DIR)/target/rust-$(RUST_TOOLCHAIN)
export CLOUDNET_CACHE_DIR CLOUDNET_IMAGES_DIR CARGO_TARGET_DIR

# Every debug build is this one cargo selection (the whole workspace, tests included), so the
# dependencies' features resolve once and each crate compiles once. A narrower `-p` selection
# leaves out the dev-dependencies' features (tokio's `test-util`) and so recompiles everything
# above tokio: about 100 crates, 5 minutes here. Binaries then run from the target directory,
# since `cargo run -p` would resolve anew.
# Clippy lints inside that build instead of in a pass of its own: clippy-driver (rustc with
# clippy's lints, as `cargo clippy` runs it) compiles the workspace's crates, rustc the
# dependencies. `cargo clippy` would first check every dependency once more: on a new 2-core
# machine that pass took 11 min 37 s of a 39 min cold `make test` (2026-11-27). Every debug cargo
# command here carries the same two variables, since cargo fingerprints the wrapper: one without
# would compile the workspace's crates again.
LINTED := RUSTC_WORKSPACE_WRAPPER="$(shell rustc --print sysroot 2>/dev/null)/bin/clippy-driver" \
	CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
BUILD := $(LINTED) cargo build --locked --workspace --all-targets
DEBUG_DIR = $(CARGO_TARGET_DIR)/debug
# Where the tests find the control plane, moto's venv, the discovery document and Cilium's CRDs
# (each script prints its cached directory).
SUITE_FIXTURES = CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_MOTO_VENV="$$(e2e-kind/moto/venv.sh)" \
	CLOUDNET_GCE_DISCOVERY="$$(e2e-kind/gce/discovery.sh)" \
	CLOUDNET_CILIUM_CRDS="$$(e2e-kind/cilium/crds.sh)"
# The e2e crate's binaries find this checkout's files (CRD, fakes' data) through it, as under cargo.
E2E_FILES := CARGO_MANIFEST_DIR="$(CURDIR)/e2e-kind"

.PHONY: help demo test controlplane moto gce images node helm prometheus cilium

## The cloud of `make demo`: AWS (moto), GCP (the GCE fake), Azure (the ARM fake) or OpenStack
## (real Keystone and Neutron).
PLATFORM ?= AWS

## This list: every target and setting of this Makefile that has a `##` comment, from those comments.
help:
	@echo "Set-up: \`make demo\` runs the main job, \`make test\` runs every check and test."
	@awk 'function entry(name, text,   words, n, i, line) { \
		n = split(text, words, " "); line = sprintf("  %-18s", name); \
		if (length(name) > 18) { print line; line = sprintf("  %-18s", "") } \
		for (i = 1; i <= n; i++) { \
			if (length(line) + length(words[i]) > 99 && line !~ /^ *$$/) { print line; line = sprintf("  %-18s", "") } \
			line = line " " words[i] } \
		print line } \
		/^## / { doc = doc (doc == "" ? "" : " ") substr($$0, 4); next } \
		/^[A-Za-z][A-Za-z0-9_-]*:/ && doc != "" { entry(substr($$0, 1, index($$0, ":") - 1), doc) } \
		/^[A-Z][A-Z_]* *\?=/ && doc != "" { entry($$1 "=", doc) } \
		{ doc = "" }' $(firstword $(MAKEFILE_LIST))

## Builds promtool from the pinned Prometheus Go module and installs the prometheus-operator CRDs
## of the pinned operator module into the cache (once): the monitoring manifests' tests.
prometheus:
	@e2e-kind/prometheus/fixtures.sh >/dev/null
	@e2e-kind/prometheus/fixtures.sh crds >/dev/null

## Installs Cilium's CiliumEgressGatewayPolicy CRD from the pinned Cilium Go module into the cache
## (once): the egress gateway story's policy (e2e-kind/tests/e2e/gateway.rs).
cilium:
	@e2e-kind/cilium/crds.sh >/dev/null

## Builds kube-apiserver, etcd and kubectl into the cache (once).
controlplane:
	@e2e-kind/controlplane/build.sh >/dev/null

## Builds the helm CLI from its Go module into the cache (once): the chart's lint, render and
## install tests.
helm:
	@e2e-kind/helm/build.sh >/dev/null

## Installs moto's EC2 server into a Python venv in the cache (once).
moto:
	@e2e-kind/moto/venv.sh >/dev/null

## Installs the Compute v1 discovery document the GCE fake checks bodies against (once).
gce:
	@e2e-kind/gce/discovery.sh >/dev/null

# The release images' binaries: the `image` profile (release, stripped; see Cargo.toml), fully
# static glibc (+crt-static; the toolchain's musl std is not installed and cannot be fetched here),
# in a target directory of their own so that neither the dev build nor the benchmarks' is
# invalidated by the RUSTFLAGS. With --target, those flags reach only the target's code, not build
# scripts or proc macros.
HOST_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
STATIC_TARGET_DIR = $(CARGO_TARGET_DIR)/static
STATIC_BIN_DIR = $(STATIC_TARGET_DIR)/$(HOST_TRIPLE)/image

# The release images' three binaries (the reconciler's is also what `bench-aws` times).
IMAGE_BUILD = CARGO_TARGET_DIR="$(STATIC_TARGET_DIR)" RUSTFLAGS="-C target-feature=+crt-static" \
	cargo build --locked --profile image --target "$(HOST_TRIPLE)" \
		-p cloudnet-webhook -p cloudnet-reconciler -p cloudnet-node \
		--bin cloudnet-webhook --bin cloudnet-reconciler --bin cloudnet-node

## Builds the tests' three images from the dev build's binaries (podman from Debian, installed once;
## the binaries' loader and libraries go in with them) and saves them as OCI archives in the cache:
## localhost/cloudnet-webhook:dev, localhost/cloudnet-reconciler:dev, localhost/cloudnet-node:dev.
## A second, optimised compile of the workspace would double the cost of a cold `make test`;
## `make release-images` is that one.
images:
	@e2e-kind/cluster/packages.sh images
	$(BUILD) --quiet
	e2e-kind/cluster/images.sh "$(DEBUG_DIR)/cloudnet-webhook" "$(DEBUG_DIR)/cloudnet-reconciler" \
		"$(DEBUG_DIR)/cloudnet-node"

# The release version: the workspace's, in Cargo.toml (the one place it is set).
VERSION := $(shell sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$$/\1/p' Cargo.toml)

.PHONY: release-images
## The images of a release: optimised static binaries (the `image` profile) alone in FROM-scratch
## images, tagged with the workspace version (localhost/cloudnet-webhook:$(VERSION)); push those
## (README, "Upgrading").
release-images:
	@e2e-kind/cluster/packages.sh images
	$(IMAGE_BUILD)
	CLOUDNET_IMAGE_TAG=$(VERSION) e2e-kind/cluster/images.sh "$(STATIC_BIN_DIR)/cloudnet-webhook" \
		"$(STATIC_BIN_DIR)/cloudnet-reconciler" "$(STATIC_BIN_DIR)/cloudnet-node"

## Builds kubelet, kube-scheduler and kube-controller-manager into the cache (once) and installs
## containerd, runc and the CNI plugins from Debian (once): the one-node cluster of the cluster tier (e2e-kind/tests/cluster/).
node:
	@e2e-kind/cluster/packages.sh node
	@e2e-kind/controlplane/build.sh node >/dev/null

## The plugin whose objects `make demo` shows: empty (a plugin writing CloudPrivateIPConfigs
## itself, as OVN-Kubernetes does), antrea (Egresses through the Antrea front end; AWS only) or
## cilium (an egress gateway and its failover, the node agents in network namespaces; AWS only,
## as root).
PLUGIN ?=

## The main job on embedded defaults: a local control plane, the webhook and the reconciler against
## the cloud named by PLATFORM, objects created as a network plugin would (PLUGIN=antrea: Antrea's
## Egresses, their IPs attached and failed over; PLUGIN=cilium: an egress gateway failed over);
## Ctrl-C stops it.
demo: controlplane moto gce $(if $(filter OpenStack openstack OPENSTACK,$(PLATFORM)),openstack) $(if $(filter cilium Cilium CILIUM,$(PLUGIN)),cilium)
	@$(BUILD) --quiet
	@$(E2E_FILES) "$(DEBUG_DIR)/cloudnet-demo" $(PLATFORM) $(PLUGIN)

# The Rust half (checks, the dev build, the images) and the fixtures (Go builds, venvs, Debian
# packages) run side by side: on a cold machine the fixtures spend minutes waiting on downloads,
# which the compiler fills. Each command's output is printed whole when it ends (-Oline).
# The cluster tier runs the images on a one-node cluster (the binaries of `node`); it skips, saying
# what is missing, only on a machine that cannot run one (not root, no cgroups).
## Every check and test, as CI runs it: formatting, clippy, the builds, the images, and every test
## tier (unit, webhook, reconciler, providers, e2e, the one-node cluster) with their fixtures.
test:
	$(MAKE) --no-print-directory -j2 --output-sync=line test-rust test-fixtures
	$(MAKE) --no-print-directory -j2 --output-sync=target test-lane-a test-lane-b

## Tests run at once within a tier binary (two binaries run side by side, see below). The
## integration tiers wait on processes (kube-apiserver, the clouds, reconcilers) far more than they
## compute: on 2 cores, 4 at a time took the reconciler tier alone from 206 s to 118 s. With two
## lanes of 4, eight control planes at once left a test's kube-apiserver answering 500 for seconds
## (2026-11-27), so 3 per lane.
TEST_THREADS ?= 3

# The test binaries run in two lanes side by side, for the same reason as TEST_THREADS: lane A the
# end-to-end and cluster tiers (about 200 s alone), lane B every other test target (about 240 s:
# the reconciler, providers and webhook tiers, the crates' own tests, the doc tests). Every test
# fixture is per test, so the lanes share nothing but the machine. A test target added to any
# crate's tests/ joins lane B by itself. Each lane's output is printed whole when it ends.
LANE_A_TESTS := e2e cluster
ALL_TESTS = $(sort $(basename $(notdir $(wildcard */tests/*.rs))) 	$(notdir $(patsubst %/main.rs,%,$(wildcard */tests/*/main.rs))))
TEST_ENV = $(SUITE_FIXTURES) \
	CLOUDNET_NODE_BIN="$$(e2e-kind/controlplane/build.sh node)" \
	CLOUDNET_HELM_BIN="$$(e2e-kind/helm/build.sh)" \
	CLOUDNET_PROMTOOL_BIN="$$(e2e-kind/prometheus/fixtures.sh)" \
	CLOUDNET_PROMETHEUS_CRDS="$$(e2e-kind/prometheus/fixtures.sh crds)" \
	CLOUDNET_IMAGES_DIR="$(CLOUDNET_IMAGES_DIR)"

.PHONY: test-lane-a test-lane-b
test-lane-a:
	$(TEST_ENV) $(LINTED) cargo test --locked --workspace $(addprefix --test ,$(LANE_A_TESTS)) -- \
		--test-threads=$(TEST_THREADS)

test-lane-b:
	$(TEST_ENV) $(LINTED) cargo test --locked --workspace --lib --bins \
		$(addprefix --test ,$(filter-out $(LANE_A_TESTS),$(ALL_TESTS))) -- --test-threads=$(TEST_THREADS)
	$(LINTED) cargo test --locked --workspace --doc

.PHONY: test-rust test-fixtures
test-rust:
	cargo fmt --all --check
	# The benchmarks' selection (no AWS SDK in the drivers) compiles too: nothing else builds it.
	cargo check --locked --quiet --no-default-features -p cloudnet-reconciler -p cloudnet-webhook \
		-p cloudnet-e2e --bins
	# --timings: the per-crate compile report (cargo-timings/ in the target directory) of every run.
	$(BUILD) --timings # clippy's lints; the e2e suite runs the webhook and reconciler binaries
	$(MAKE) --no-print-directory images # after the dev build, so a compile error shows first

test-fixtures: controlplane moto gce openstack node helm prometheus cilium

# The reconciler and webhook benchmarks build only the measured binary and the driver in the
# `benchmark` profile, and run them from the target directory (`cargo run` alone would resolve
# features anew and rebuild). One cargo invocation shares the dependencies' features and builds,
# except where naming the reconciler's feature would also switch on the e2e crate's optional
# dependency on it (`--features cloudnet-reconciler/memory-cloud` does both), and with it an SDK.
BENCH_DIR = $(CARGO_TARGET_DIR)/benchmark

.PHONY: bench-reconciler
## Reconciler benchmark (not a test): 1,000 objects over 100 nodes, memory cloud at 50 ms per call,
## the reconciler (benchmark profile, built without its `aws` feature: no AWS SDK) as its own process.
## Pass BENCH_ARGS="10000 1000" for the memory-scale run; BENCH_COALESCE_MS,
## BENCH_CONCURRENT_RECONCILES and BENCH_FLOOR=0 are described in e2e-kind/src/bin/bench-reconciler.rs.
## JSON lands in $(CLOUDNET_CACHE_DIR)/bench/.
bench-reconciler: controlplane
	cargo build --profile benchmark --locked --quiet -p cloudnet-reconciler --no-default-features \
		--features memory-cloud --bin cloudnet-reconciler
	cargo build --profile benchmark --locked --quiet -p cloudnet-e2e --no-default-features \
		--bin bench-reconciler
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_RECONCILER_BIN="$(BENCH_DIR)/cloudnet-reconciler" \
	"$(BENCH_DIR)/bench-reconciler" $(BENCH_ARGS)

.PHONY: bench-scale
## Scale benchmark (not a test): 5,000 nodes and 20,000 objects over the memory cloud, 1,000
## instances and 5,000 objects on moto with EC2's token buckets and a leader change, and the
## webhook with 20,000 objects in its caches. Prints time from leadership to every node annotated,
## cloud reads and mutating calls, a failover move issued right after a leader change, RSS and p99,
## beside their targets. BENCH_PARTS, BENCH_MEMORY, BENCH_MOTO and the rest are described in
## e2e-kind/src/bin/bench-scale.rs. All three binaries are optimised (benchmark profile, AWS SDK
## unoptimised; no GCP or Azure SDK). JSON lands in $(CLOUDNET_CACHE_DIR)/bench/.
bench-scale: controlplane moto
	cargo build --profile benchmark --locked --quiet -p cloudnet-reconciler -p cloudnet-webhook \
		-p cloudnet-e2e --no-default-features --features cloudnet-reconciler/memory-cloud,cloudnet-e2e/aws \
		--bin cloudnet-reconciler --bin cloudnet-webhook --bin bench-scale
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_MOTO_VENV="$$(e2e-kind/moto/venv.sh)" \
	CLOUDNET_RECONCILER_BIN="$(BENCH_DIR)/cloudnet-reconciler" \
	CLOUDNET_WEBHOOK_BIN="$(BENCH_DIR)/cloudnet-webhook" \
	$(E2E_FILES) "$(BENCH_DIR)/bench-scale"

.PHONY: bench-webhook
## Webhook load benchmark (not a test): 1,000 nodes and 10,000 objects in its caches, keep-alive TLS
## load on /validate and /mutate. BENCH_DURATION_SECS, BENCH_CONNECTIONS tune it. JSON lands in
## $(CLOUDNET_CACHE_DIR)/bench/. The load generator is optimised too (it must outrun the webhook)
## and built without the AWS SDK (cloudnet-e2e without its `aws` feature).
bench-webhook: controlplane
	cargo build --profile benchmark --locked --quiet -p cloudnet-webhook -p cloudnet-e2e \
		--no-default-features --bin cloudnet-webhook --bin bench-webhook
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_WEBHOOK_BIN="$(BENCH_DIR)/cloudnet-webhook" \
	"$(BENCH_DIR)/bench-webhook"

.PHONY: bench-aws
## EC2 benchmark (not a test): moto behind the fault proxy, the reconciler with upstream's flags;
## 1,000 objects over 100 instances added, 200 moved, all deleted; once unlimited, once with EC2's
## token buckets and 100 ms per call. It times the reconciler as shipped: the release images'
## binary (the `image` profile, built here; the driver is the dev build's).
## BENCH_ARGS="OBJECTS NODES MOVED"; BENCH_MODES, BENCH_LATENCY_MS, BENCH_PHASE_TIMEOUT_SECS,
## BENCH_IN_FLIGHT and BENCH_RECONCILER_ARGS (flags added to the reconciler's) are described in
## e2e-kind/src/bin/bench-aws.rs. JSON lands in $(CLOUDNET_CACHE_DIR)/bench/.
bench-aws: controlplane moto
	$(BUILD) --quiet
	$(IMAGE_BUILD) --quiet
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_MOTO_VENV="$$(e2e-kind/moto/venv.sh)" \
	CLOUDNET_RECONCILER_BIN="$(STATIC_BIN_DIR)/cloudnet-reconciler" \
	$(E2E_FILES) "$(DEBUG_DIR)/bench-aws" $(BENCH_ARGS)

.PHONY: bench-antrea
## Antrea failover benchmark (not a test): the reconciler as shipped with `--front-end antrea`,
## against moto behind the fault proxy with EC2's token buckets and 100 ms per call; 50 Egresses
## of an opted-in pool fail over at once (the agents' status writes), four times. Prints the time
## from each status change (the agent's PUT) to EC2's answer putting the IP on the new node's ENI
## (p50/p90/p99/max)
## and the calls per IP. BENCH_ARGS="EGRESSES ROUNDS"; BENCH_LATENCY_MS and the rest are described
## in e2e-kind/src/bin/bench-antrea.rs. JSON lands in $(CLOUDNET_CACHE_DIR)/bench/.
bench-antrea: controlplane moto
	$(BUILD) --quiet
	$(IMAGE_BUILD) --quiet
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_MOTO_VENV="$$(e2e-kind/moto/venv.sh)" \
	CLOUDNET_RECONCILER_BIN="$(STATIC_BIN_DIR)/cloudnet-reconciler" \
	$(E2E_FILES) "$(DEBUG_DIR)/bench-antrea" $(BENCH_ARGS)

.PHONY: bench-gateway
## Egress gateway failover benchmark (not a test; needs root: each node's agent runs in a network
## namespace of its own): the reconciler as shipped with `--front-end=egress-gateway`, against moto
## behind the fault proxy with EC2's token buckets and 100 ms per call, and the real node agent of
## each of three nodes; 20 gateways active on one node fail over at once when its agent stops, four
## times. Prints the time from the agent's last heartbeat to the gateways active on the new node,
## their IPs on its ENI and interface and the label moved (p50/p90/p99/max) and the calls per IP.
## BENCH_ARGS="GATEWAYS ROUNDS"; BENCH_NODES, BENCH_LATENCY_MS and the rest are described in
## e2e-kind/src/bin/bench-gateway.rs. JSON lands in $(CLOUDNET_CACHE_DIR)/bench/.
bench-gateway: controlplane moto
	$(BUILD) --quiet
	$(IMAGE_BUILD) --quiet
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_MOTO_VENV="$$(e2e-kind/moto/venv.sh)" \
	CLOUDNET_RECONCILER_BIN="$(STATIC_BIN_DIR)/cloudnet-reconciler" \
	$(E2E_FILES) "$(DEBUG_DIR)/bench-gateway" $(BENCH_ARGS)

.PHONY: bench-gcp
## GCP benchmark (not a test): the engine's lanes over the GCP provider, against the GCE fake behind
## the fault proxy; 1,000 IPs over 100 VMs attached, 200 moved, all detached; once unlimited, once
## with latency and 429s. Counts calls, so the dev build serves. BENCH_ARGS="OBJECTS NODES MOVED";
## BENCH_LATENCY_MS, BENCH_THROTTLE and BENCH_OPERATION_MS are described in
## e2e-kind/src/bin/bench-gcp.rs. JSON lands in $(CLOUDNET_CACHE_DIR)/bench/.
bench-gcp: gce
	$(BUILD) --quiet
	CLOUDNET_GCE_DISCOVERY="$$(e2e-kind/gce/discovery.sh)" $(E2E_FILES) "$(DEBUG_DIR)/bench-gcp" $(BENCH_ARGS)

.PHONY: bench-azure
## Azure benchmark (not a test): the Azure provider against the ARM fake behind the fault proxy;
## 512 IPs over 16 VMs attached, moved and detached, batched per VM as the engine batches and one
## PUT per IP as upstream does. Counts calls, so the dev build serves. BENCH_ARGS="IPS VMS";
## BENCH_LATENCY_MS and BENCH_OPERATION_MS are described in e2e-kind/src/bin/bench-azure.rs.
## JSON lands in $(CLOUDNET_CACHE_DIR)/bench/.
bench-azure:
	$(BUILD) --quiet
	@mkdir -p "$(CLOUDNET_CACHE_DIR)/bench"
	BENCH_JSON="$${BENCH_JSON:-$(CLOUDNET_CACHE_DIR)/bench/azure-$$(date -u +%Y%m%dT%H%M%SZ).json}" \
		$(E2E_FILES) "$(DEBUG_DIR)/bench-azure" $(BENCH_ARGS)

.PHONY: bench-public
## Public-address benchmark (not a test): EgressPublicIP bindings whose egress IPs move between two
## nodes; the time from each move's patch to its Elastic IP associated on the new node, and from
## the private attach there, under EC2's token buckets and 100 ms per call (moto behind the fault
## proxy, the reconciler in process), and the calls per move. BENCH_ARGS="BINDINGS ROUNDS";
## BENCH_LATENCY_MS. JSON lands in $(CLOUDNET_CACHE_DIR)/bench/.
bench-public: controlplane moto
	$(BUILD) --quiet
	CLOUDNET_CONTROLPLANE_BIN="$$(e2e-kind/controlplane/build.sh)" \
	CLOUDNET_MOTO_VENV="$$(e2e-kind/moto/venv.sh)" \
	$(E2E_FILES) "$(DEBUG_DIR)/bench-public" $(BENCH_ARGS)

# The integration tests of the shared and webhook crates: no fixtures, no processes.
UNIT_TESTS = $(foreach t,$(basename $(notdir $(wildcard shared/tests/*.rs webhook/tests/*.rs))),--test $(t))

.PHONY: unit
## The fast checks: every crate's unit tests and the shared and webhook crates' own tests, with no
## fixture, control plane or cloud (seconds once built; the same build as `make test`).
unit:
	$(LINTED) cargo test --locked --workspace --lib --bins $(UNIT_TESTS)

.PHONY: e2e
## The end-to-end suite alone: control plane, moto behind the fault proxy, webhook and reconciler
## as separate processes. CLOUDNET_E2E_KUBECONFIG (+ CLOUDNET_E2E_EC2_URL) targets a cluster.
e2e: controlplane moto gce cilium
	$(BUILD)
	$(SUITE_FIXTURES) $(LINTED) cargo test --locked --workspace --test e2e

.PHONY: openstack
## Installs Keystone and Neutron (and gunicorn) into a Python venv in the cache (once, about 2
## minutes cold, 385 MB); the OpenStack tests find it through e2e-kind/openstack/venv.sh.
openstack:
	@e2e-kind/openstack/venv.sh >/dev/null

# The OpenStack provider tests and e2e_openstack run against real Keystone and Neutron.
e2e: openstack
