# orchestrator - developer and operator entry points. `make help` lists them.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
PYTEST  ?= $(BIN)/pytest
# Most tests wait on real processes (sshd, pip, simulated servers): 6 workers keep 2 cores busy
# (with 4 they idled ~10% of the run, all waiting at once).
# --dist loadfile keeps each module (and its module-scoped simulated box) on one worker.
# --no-loadscope-reorder: modules are handed out in collection order, which tests/conftest.py
# makes the slowest first (xdist's default, most tests first, started the longest ones last).
PYTEST_ARGS ?= -n 6 --dist loadfile --no-loadscope-reorder

.PHONY: help venv test lint bench demo hello drill faults soak sync-sglang fidelity-real clean gateway-wheels fleet-demo

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 12

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'  # dev includes the report and sim extras
	@touch $(STAMP)

venv: $(STAMP)  ## create .venv and install orchestrator, its dev tools and the simulator (sim/); fetch the gateway wheels
	@$(BIN)/python scripts/fetch_gateway_wheels.py || echo "gateway tests will skip (no smg wheel)"

test: venv  ## run the test suite (soak tests excluded); installs OpenSSH first when it can
	@bash scripts/test-prereqs.sh
	@$(BIN)/python -m compileall -q orchestrator sim tests scripts >/dev/null  # bytecode once, even under PYTHONDONTWRITEBYTECODE
	@$(PYTEST) -q $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

gateway-wheels: venv  ## the real smg (SMG gateway) wheel + deps, once, into .cache/ (gateway tests use it)
	$(BIN)/python scripts/fetch_gateway_wheels.py

lint: venv  ## ruff, and ARCHITECTURE.md's layer table as import contracts (lint-imports)
	$(BIN)/ruff check orchestrator tests scripts bench sim
	$(BIN)/python scripts/contracts.py --check
	$(BIN)/lint-imports --no-logo

bench: venv  ## benchmarks, reported as ratios measured in one run
	$(BIN)/python scripts/bench_transport.py
	$(BIN)/python scripts/bench_sim.py
	$(BIN)/python scripts/bench_deploy.py
	$(BIN)/python scripts/bench_inventory.py
	$(BIN)/python scripts/bench_converged.py

.PHONY: bench-demo
bench-demo: venv  ## simulated host: baseline vs EAGLE-3 bench, a small tune, report + PNGs (< 4 min)
	$(BIN)/python scripts/bench_demo.py

demo: venv  ## deploy Kimi K2.6 + EAGLE-3 to a simulated 8-GPU host, twice, then stop it
	BIN=$(BIN) bash scripts/demo.sh

fleet-demo: venv  ## 3 replicas + the SMG gateway under load: roll, kill a replica, kill a roll; one summary line
	$(BIN)/python scripts/fleet_demo.py

drill: venv  ## reboot drill on a simulated box: deploy, reboot, deploy, verify; recovery time
	$(BIN)/python scripts/drill.py

faults: venv  ## the fault matrix: every injectable fault, outcome, detect time, leftovers
	$(BIN)/python scripts/faults.py

soak: venv  ## 50 cycles of deploy -> reboot -> deploy on 4 flaky simulated hosts (long)
	$(BIN)/python scripts/soak.py

hello: venv  ## the small example playbook on localhost
	$(BIN)/orchestrator deploy playbooks/examples/hello.yaml -i configs/inventory/local.yaml

sync-sglang: venv  ## regenerate orchestrator/sglang/releases/*.json from the real SGLang wheels (network); ARGS=--check: change nothing, fail on a stale file or a newer release on the index
	$(BIN)/python scripts/sync_sglang.py $(ARGS)

fidelity-real: venv  ## run the REAL SGLang start-up validation of every release on the fidelity table (network; builds .cache/real-serverargs, ~2 GB; 10-20 min) and record it in tests/sglang/real_serverargs.json
	sh scripts/real_serverargs/setup.sh
	$(BIN)/python scripts/real_serverargs/record.py $(ARGS)

clean:  ## remove the venv, caches and run records
	rm -rf $(VENV) runs .sim .pytest_cache .ruff_cache *.egg-info sim/*.egg-info
