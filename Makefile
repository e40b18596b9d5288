# Fresh-machine entry points: `make demo` and `make test` set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck layers check bench accuracy clean proto soak xids

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/taugrid-evidence demo --speed 20 --duration 45

lint: setup
	$(BIN)/ruff check collector exporters kubesim tests bench dashboards taugrid_evidence

typecheck: setup
	$(BIN)/mypy
	MYPYPATH=bench $(BIN)/mypy --strict --explicit-package-bases bench/*.py  # the benchmarks import each other by name

layers: setup
	$(BIN)/lint-imports

check: lint typecheck layers

test: setup check
	$(BIN)/pytest -q --durations=20

bench: setup
	$(BIN)/python bench/bench_scan.py
	$(BIN)/python bench/bench_controller.py --quick
	$(BIN)/python bench/bench_stall.py --quick
	$(BIN)/python bench/bench_bundles.py --events 5000 --pods 2000
	$(BIN)/python bench/bench_redact.py
	$(BIN)/python bench/bench_agent.py --quick
	$(BIN)/python bench/bench_spool.py --rows 100000

# Claims against the simulator's ground truth (docs/accuracy.md): the class suite (520 generated runs)
# and the randomized search for fail-open claims (5,000 draws, the failures shrunk to minimal cases).
# About half an hour on 2 cores; one draw replays with `bench/accuracy_search.py --seed 1 --draw N`.
accuracy: setup
	$(BIN)/python bench/accuracy_search.py --classes 520 --draws 5000 --seed 1 --per-scenario 200 --shrink 8 \
		--out docs/accuracy.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build *.egg-info

# The kubelet pod-resources v1 messages the node agent decodes (committed; protobuf pinned in pyproject.toml).
proto: setup
	cd collector/agent/podresources && ../../../$(BIN)/python -m grpc_tools.protoc -I. --python_out=. podresources_v1.proto

# Long fault soak and the fleet-size benchmarks (issue 9): minutes each, not in CI.
soak: setup
	$(BIN)/python bench/soak_faults.py --minutes 10
	$(BIN)/python bench/bench_fleet.py --pods 50000

# NVIDIA's XID catalogue (collector/progress/xid_nvidia_catalog.tsv, with its provenance) -> the
# xid_catalog.json the product loads; tests/progress/test_xid_catalogue.py fails when the two drift apart.
xids: setup
	$(BIN)/python -m collector.progress.xid_build
