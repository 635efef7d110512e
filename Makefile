# volume-stream: `make demo` and `make test` work on a fresh machine (Python 3.11, Java 17).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# the jar groups `make install` fetches: Delta Lake's Spark connector; add s3 (hadoop-aws and
# the AWS SDK, ~690 MB) where Spark reads s3a:// paths: make install JARS="delta s3" (as CI
# does), or later `volume-stream jars fetch s3`
JARS   ?= delta
# Azurite, Microsoft's Blob/Queue emulator, for the Azure tests and benchmarks (tests never
# download: they start it from here)
AZURITE := $(VENV)/node/node_modules/.bin/azurite

.PHONY: install emulators jars s3jars demo test soak bench lint clean

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing volume-stream, PySpark, delta-rs, moto and the dev tools"
	@echo "    (about 2 minutes the first time; pip lists each package as it goes)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off -e ".[dev]"
	@echo "==> fetching the JVM jars once into $(VENV)/jars: $(JARS) (delta: Delta Lake's Spark"
	@echo "    connector; s3: hadoop-aws with the AWS SDK for s3a://; tests never download them)"
	$(PY) -m volume_stream._jars fetch $(JARS)
	@echo "==> a class-data archive of Spark's classes, so each local Spark starts in about half the CPU"
	$(PY) -m volume_stream._cds
	touch $(STAMP)
	@echo "==> installed: the command is $(VENV)/bin/volume-stream; after . $(VENV)/bin/activate it is on PATH"

install: $(STAMP) emulators

# Azurite 3.x from npm into $(VENV)/node (Node.js >= 18)
$(AZURITE): | $(STAMP)
	@echo "==> Azurite (Azure Blob/Queue emulator) from npm into $(VENV)/node"
	mkdir -p $(VENV)/node
	npm install --no-audit --no-fund --prefix $(VENV)/node azurite@3

# the GCS emulators (tests/gcp_fixtures.py), built from the Go module proxy into $(VENV)/bin
# once: fake-gcs-server (GCS, publishing its bucket notifications to Pub/Sub) and
# pstest, the Go client library's Pub/Sub fake, in a small program (tests/emulators/pstest).
# GOPATH and the build cache live in .go/ (writable, ignored by git)
GO       ?= go
GO_ENV   := GOPATH=$(CURDIR)/.go GOCACHE=$(CURDIR)/.go/cache GOFLAGS=-mod=mod GOTOOLCHAIN=local
FAKE_GCS := github.com/fsouza/fake-gcs-server@v1.56.1
GCS_EMULATORS := $(VENV)/bin/fake-gcs-server $(VENV)/bin/pstest

$(VENV)/bin/fake-gcs-server: | $(STAMP)
	@echo "==> building fake-gcs-server ($(FAKE_GCS)) into $(VENV)/bin (about 2 minutes once)"
	$(GO_ENV) GOBIN=$(abspath $(VENV))/bin $(GO) install $(FAKE_GCS)

$(VENV)/bin/pstest: tests/emulators/pstest/main.go tests/emulators/pstest/go.mod | $(STAMP)
	@echo "==> building the Pub/Sub fake (tests/emulators/pstest) into $(VENV)/bin"
	cd tests/emulators/pstest && $(GO_ENV) $(GO) build -o $(abspath $(VENV))/bin/pstest .

# the emulators the tests start, built or installed into $(VENV) once: fake-gcs-server and
# pstest (GCS and Pub/Sub, tests/gcp_fixtures.py) from the Go module proxy, Azurite (Azure
# Blob/Queue, tests/azure_fixtures.py) from npm
emulators: $(GCS_EMULATORS) $(AZURITE)

# the jars again (after `rm -rf .venv/jars`, or to check them: prints what is there;
# make jars JARS="delta s3" adds the s3a jars and builds the archive for the new class path)
jars: $(STAMP)
	$(PY) -m volume_stream._jars fetch $(JARS)
	$(PY) -m volume_stream._cds

# the suite writes s3a:// (moto) through Spark: the s3 jars once (a no-op when fetched; when
# new, the class-data archive is built again for the longer class path)
s3jars: $(STAMP)
	$(PY) -m volume_stream.cli jars fetch s3

demo: $(STAMP)
	$(PY) examples/demo.py

# the fast suite: everything but the real-process scenarios (`slow`: each starts its own Spark
# JVMs, SIGKILLs daemons 20 times, runs a local cluster) and the long random runs (`soak`), on
# three workers on two cores (pytest-xdist; a file's tests stay on one worker, each worker has
# its own Spark): a worker waits on its subprocesses, daemons and JVMs a third of the time, so
# a third one keeps both cores busy (measured under the same load: 21 min 27 s on two
# workers, 15 min 43 s on three, the same CPU time)
test: s3jars emulators
	$(PY) -m pytest -q -m "not soak and not slow" -n 3 --dist loadfile

# the real-process scenarios marked `slow` (spark-submit, a local cluster, daemons SIGKILLed
# 20 times, a daemon SIGKILLed 5 times on a store answering part uploads 10 s late while 200
# files come and go, pipeline crashes, the Structured Streaming source's restarts), hundreds of random
# histories against the oracle (tests/volume_stream/test_histories.py), 3000
# random requests against the shard API (tests/volume_stream/test_shard_api_fuzz.py; a
# SHARD-API-FUZZ line), 1000 random DELETE/UPDATE/MERGE conditions against Spark SQL
# (tests/volume_stream/tables/test_predicates.py), Spark's OPTIMIZE/ZORDER/VACUUM racing our
# writer and a Spark-written pipeline target SIGKILLed between its commits (tests/interop/),
# then the full fault scenario: a daemon SIGKILLed 20 times under 10%
# faults while 500 files come and go (tests/warehouse/test_fault_scenario.py; its figures are
# printed as a FAULT-SCENARIO line), then group commit under a flood with 8 SIGKILLs
# (tests/volume_stream/test_group_commit_kills.py; a GROUP-COMMIT-KILLS line)
soak: s3jars emulators
	$(PY) -m pytest -q -p no:cacheprovider -m "slow and not soak" -k "not killed_at_random"
	HYPOTHESIS_PROFILE=soak $(PY) -m pytest -q -p no:cacheprovider --timeout=0 \
		tests/volume_stream/test_histories.py tests/interop/test_histories.py
	HYPOTHESIS_PROFILE=soak $(PY) -m pytest -q -s -p no:cacheprovider --timeout=0 \
		-m soak tests/volume_stream/test_shard_api_fuzz.py
	VS_PREDICATE_EXAMPLES=1000 $(PY) -m pytest -q -p no:cacheprovider --timeout=0 \
		tests/volume_stream/tables/test_predicates.py -k touches_exactly
	VS_EXIT_RUNS=10 $(PY) -m pytest -q -p no:cacheprovider tests/test_exit_codes.py -k every_time
	$(PY) -m pytest -q -p no:cacheprovider -m soak tests/warehouse/test_pipeline_faults.py
	$(PY) -m pytest -q -p no:cacheprovider --timeout=1800 -m soak \
		tests/interop/test_users_tools.py tests/interop/test_delta_target.py
	VOLUME_STREAM_FAULT_PROFILE=full $(PY) -m pytest -q -s -p no:cacheprovider --timeout=0 \
		tests/warehouse/test_fault_scenario.py -k killed_at_random
	$(PY) -m pytest -q -s -p no:cacheprovider --timeout=0 -m soak \
		tests/volume_stream/test_group_commit_kills.py

bench: s3jars emulators
	$(PY) -m benchmarks

lint: $(STAMP)
	$(VENV)/bin/ruff check volume_stream connectors directory_table tests benchmarks examples
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir .site   # a broken link fails

clean:
	rm -rf $(VENV) .pytest_cache warehouse .bench .site .go
