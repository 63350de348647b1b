#!/usr/bin/env bash
# `make demo`: the main job end to end against a simulated 8-GPU host.
#   1. start a simulated RTX PRO 6000 x8 LXC host (with its Proxmox hypervisor, model hub and
#      package index) on loopback;
#   2. deploy Kimi K2.6 + EAGLE-3 with the real playbook, over SSH with host keys checked;
#   3. deploy again: a converged host changes nothing;
#   4. show `orchestrator status`, then stop the simulated host (also on failure).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
SIM=${SIM_DIR:-.sim/demo}
PLAYBOOK=playbooks/kimi-k2.6-eagle3.yaml
orch() { "$BIN/orchestrator" "$@"; }

orch sim down --dir "$SIM" >/dev/null 2>&1 || true
rm -rf "$SIM"  # a fresh box every time
t0=$(date +%s.%N)  # GNU date
orch sim up --dir "$SIM" --hosts 1
trap 'orch sim down --dir "$SIM"' EXIT

echo
echo "== make the host look like the user's box: a venv without pip, compressed-tensors 0.8.1"
"$BIN/python" scripts/sim_as_found.py "$SIM" gpu-1

echo
echo "== deploy: $PLAYBOOK"
t1=$(date +%s.%N)
orch deploy "$PLAYBOOK" -i "$SIM/inventory.yaml"
t2=$(date +%s.%N)

echo
echo "== deploy again: the host is converged, nothing should change"
orch deploy "$PLAYBOOK" -i "$SIM/inventory.yaml"
t3=$(date +%s.%N)

echo
echo "== status"
if orch status --help >/dev/null 2>&1; then
  orch status -i "$SIM/inventory.yaml" --limit gpu
fi
"$BIN/python" -c 'import sys, time; t0, t1, t2, t3 = map(float, sys.argv[1:])
print(f"\ndemo: first deploy {t2 - t1:.1f}s, converged re-run {t3 - t2:.1f}s, "
      f"whole demo {time.time() - t0:.1f}s")' "$t0" "$t1" "$t2" "$t3"
