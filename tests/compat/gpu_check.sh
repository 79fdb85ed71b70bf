#!/usr/bin/env bash
# `make gpu-check`: on a machine with a CUDA GPU and its torch (no cluster, no network), the warm-start scenarios
# on the GPU, the per-version rendezvous scenarios and the store-outage ride-out against that torch, then the
# restart benchmark. Usage: tests/compat/gpu_check.sh [REPORT_DIR]; PYTHON picks the interpreter (default python3).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
report=${1:-$root/.gpu-check}
python=${PYTHON:-python3}
mkdir -p "$report"
export PYTHONPATH="$root/operator:$root/tests:$root/tests/integration:$root/tests/unit:$root${PYTHONPATH:+:$PYTHONPATH}"
export COMPAT_EXPECT=on
"$python" - <<'PY' | tee "$report/machine.txt"
import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"devices {[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}")
PY
status=0
(cd "$root/tests" && timeout 300 "$python" -m pytest --noconftest -p no:cacheprovider -q -s -rA \
    --junitxml="$report/junit.xml" compat/gpu_scenarios.py compat/scenarios.py unit/test_warm_outage.py \
    unit/test_warm_polling.py unit/test_warm_compat.py unit/test_store_compat.py \
    integration/test_store_agents.py::test_killed_node_removed_and_round_completed_at_once) \
    >"$report/pytest.log" 2>&1 || status=1
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed|restarted warm|DDP \(" "$report/pytest.log" | tail -40
timeout 400 "$python" "$root/bench/gpu_restart.py" --runs 3 2>"$report/bench.log" | tee "$report/bench.md" || status=1
exit $status
