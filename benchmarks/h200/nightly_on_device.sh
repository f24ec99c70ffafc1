#!/bin/bash
# The nightly's fixed tests on the lent H200 against the committed baselines, then the known
# slowdown (the poor tiling, perf_tests/moe_configs/h200-poor) on the bf16 test, in a process
# session of its own so that it outlives the device tool's 10-minute calls.
#   start COMMIT   begin (after stage.sh has unpacked vLLM into /root/site)
#   watch SECONDS  wait until both are done or SECONDS passed, then pack /root/moeperf-out into $OUT
# Not /root/out: that is the device tool's $OUT, emptied before every call (a first run lost its
# logs there). Baselines are judged from a copy in /root/moeperf-out/baselines: with the refresh flag a passing
# test writes its own runs there (the second nightly as a file), the committed ones stay.
set -u
O=/root/moeperf-out
case "${1:-}" in
start)
  mkdir -p "$O" && cp -r baselines "$O/baselines"
  nvidia-smi -q > "$O/nvidia-smi-before.txt" 2>&1
  MOEPERF_GIT_COMMIT="$2" setsid nohup bash "$0" body > "$O/driver.log" 2>&1 < /dev/null &
  echo "started $(date -u +%T)" ;;
body)
  export PYTHONPATH=/root/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
  t0=$(date +%s)
  python3 -X faulthandler -m pytest perf_tests/test_h200.py --gpu -k fixed -p no:cacheprovider -rA \
    --moeperf-refresh-baselines --moeperf-reason "second nightly on a fresh H200" \
    --moeperf-baseline-dir "$O/baselines" --moeperf-results "$O/results-nightly.json" \
    --moeperf-report "$O/report-nightly" --junitxml "$O/junit-nightly.xml" > "$O/pytest-nightly.log" 2>&1
  echo "nightly rc=$? wall_s=$(( $(date +%s) - t0 ))" >> "$O/state.txt"
  cat > perf_tests/test_h200_slowdown.py <<'PY'
import pytest

@pytest.mark.moeperf_gpu
@pytest.mark.moeperf_spec("h200-fixed-1024-128.yaml")
@pytest.mark.moeperf_moe_config("moe_configs/h200-poor")
def test_h200_fixed_poor(moeperf) -> None:  # type: ignore[no-untyped-def]
    moeperf.run()
PY
  t0=$(date +%s)
  python3 -X faulthandler -m pytest perf_tests/test_h200_slowdown.py --gpu -p no:cacheprovider -rA \
    --moeperf-runs 2 --moeperf-refresh-baselines --moeperf-reason "known slowdown: poor tiling" \
    --moeperf-baseline-dir "$O/slow-baselines" --moeperf-results "$O/results-slowdown.json" \
    > "$O/pytest-slowdown.log" 2>&1
  echo "slowdown rc=$? wall_s=$(( $(date +%s) - t0 ))" >> "$O/state.txt" ;;
watch)
  end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$end" ] && ! grep -q slowdown "$O/state.txt" 2>/dev/null; do sleep 5; done
  cat "$O/state.txt" 2>/dev/null; tail -5 "$O/pytest-nightly.log" "$O/pytest-slowdown.log" 2>/dev/null
  nvidia-smi > "$O/nvidia-smi-now.txt" 2>&1
  tar -C /root -czf "$OUT/out.tgz" moeperf-out; cp "$O"/*.json "$O"/*.log "$OUT"/ 2>/dev/null ;;
esac
