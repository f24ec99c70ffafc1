#!/bin/bash
# Device-side driver for the lent H200: a list of stages, run one after another in a process
# session of its own, so that the work outlives the device tool's 10-minute calls.
#   start COMMIT STAGE...  begin (after stage.sh has unpacked vLLM into /root/site)
#   watch SECONDS          wait until every stage is done or SECONDS passed, then pack
#                          /root/moeperf-out into $OUT (also when cut short: each stage writes
#                          its results as it goes)
# Stages:
#   bf16 | fp8 | chat  one nightly test with --moeperf-refresh-baselines (3 runs), judged and
#                      written in /root/moeperf-out/baselines (a copy of the committed folder)
#   bf16r5 (r3..r9)    bf16 refreshed with that many runs (a band from 3 runs can span 2.8x);
#                      REASON= overrides the recorded reason
#   chat1 .. chat9     the chat-mix test with that many runs and no refresh (a short session)
#   nightly            the whole nightly selection (every --gpu test but the A/B gate), refresh
#   cbf16 | cfp8 | cchat  that one nightly test as CI runs it: no refresh, judged against the
#                      committed baselines (a second night on the card that recorded them)
#   compared           the same selection as CI runs it: no refresh, judged against the committed
#                      baselines (a compared run seeds its first search from their brackets)
#   auto               compared where the committed baselines have this GPU's (the H100's since
#                      2026-12-06), else nightly: a lent card of either kind gets the useful one
#   restarts           benchmarks/h200/restarts.py: three starts of one build (cold, cached,
#                      recompiled), the same seeded probes at 16, 20, 23 req/s on each
#                      (11, 14, 17 on an H100)
#   longrun            benchmarks/h200/long_run_check.py at the bf16 baseline's boundary R and 1.1 R
#   gate               the PR gate end to end on an H200 (another GPU skips it: the file is
#                      the H200's): in-tree vs large-M-worse (every key M >= 64 poorly tiled),
#                      with the per-M kernel A/B, the A/A control and a sweep at 16, 64, 128
#                      for the per-M cross-check; summary and per-M files in gate/
#   slow               the known slowdown: the poor tiling (perf_tests/moe_configs/h200-poor) on
#                      the bf16 spec, 2 runs recorded in slow-baselines/, then `moeperf compare`
#                      of the bf16 baseline against it (the config hash keys it apart, so the
#                      pytest run itself finds no baseline to judge)
# Not /root/out: that is the device tool's $OUT, emptied before every call.
set -u
O=/root/moeperf-out
env_run() {
  PYTHONPATH=/root/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 "$@"
}
nightly_test() {  # name, pytest selection...
  local name=$1; shift
  env_run python3 -X faulthandler -m pytest "$@" --gpu -p no:cacheprovider -rA \
    --moeperf-refresh-baselines --moeperf-reason "${REASON:-first $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) baselines of measurement v2}" \
    --moeperf-baseline-dir "$O/baselines" --moeperf-results "$O/results-$name.json" \
    --moeperf-report "$O/report-$name" --junitxml "$O/junit-$name.xml" \
    --moeperf-records "$O/records-$name" > "$O/pytest-$name.log" 2>&1
}
stage() {
  local t0 rc; t0=$(date +%s)
  echo "$1 begin $(date -u +%T)" >> "$O/state.txt"
  case "$1" in
  bf16) nightly_test bf16 perf_tests/test_h200.py::test_h200_fixed_in_tree ;;
  bf16r[3-9])  # its own reason unless REASON says one: fp8 after it in one night keeps "first"
    MOEPERF_RUNS="${1#bf16r}" REASON="${REASON:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) bf16 baseline re-recorded with ${1#bf16r} runs at ${MOEPERF_GIT_COMMIT:-?}: the 3-run bands were too wide}" \
      nightly_test "$1" perf_tests/test_h200.py::test_h200_fixed_in_tree ;;
  fp8) nightly_test fp8 perf_tests/test_h200.py::test_h200_fixed_fp8_in_tree ;;
  chat) nightly_test chat perf_tests/test_h200.py::test_h200_chat_mix_in_tree ;;
  chat[1-9])  # N runs, no refresh: a short device session's look at chat-mix's probes
    env_run python3 -X faulthandler -m pytest perf_tests/test_h200.py::test_h200_chat_mix_in_tree \
      --gpu -p no:cacheprovider -rA --moeperf-runs "${1#chat}" --moeperf-baseline-dir "$O/baselines" \
      --moeperf-results "$O/results-$1.json" --moeperf-report "$O/report-$1" \
      --junitxml "$O/junit-$1.xml" --moeperf-records "$O/records-$1" > "$O/pytest-$1.log" 2>&1 ;;
  nightly) nightly_test nightly perf_tests -k "not moe_config_ab" ;;
  cbf16|cfp8|cchat)  # one nightly test as CI runs it: no refresh, judged against the committed baselines
    local t=test_h200_fixed_in_tree
    [ "$1" = cfp8 ] && t=test_h200_fixed_fp8_in_tree
    [ "$1" = cchat ] && t=test_h200_chat_mix_in_tree
    env_run python3 -X faulthandler -m pytest "perf_tests/test_h200.py::$t" --gpu \
      -p no:cacheprovider -rA --moeperf-baseline-dir "$O/baselines" \
      --moeperf-results "$O/results-$1.json" --moeperf-report "$O/report-$1" \
      --junitxml "$O/junit-$1.xml" --moeperf-records "$O/records-$1" > "$O/pytest-$1.log" 2>&1 ;;
  compared)  # the nightly as CI runs it: no refresh, judged against the committed baselines
    env_run python3 -X faulthandler -m pytest perf_tests -k "not moe_config_ab" --gpu \
      -p no:cacheprovider -rA --moeperf-baseline-dir "$O/baselines" \
      --moeperf-results "$O/results-compared.json" --moeperf-report "$O/report-compared" \
      --junitxml "$O/junit-compared.xml" --moeperf-records "$O/records-compared" \
      > "$O/pytest-compared.log" 2>&1 ;;
  auto)
    local g; g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' _)
    if ls "$O"/baselines/*test_h200_fixed_in_tree*/cuda-"$g"x1-*.json >/dev/null 2>&1; then
      echo "auto: the baselines have $g: compared" >> "$O/state.txt"; stage compared
    else
      echo "auto: no baselines for $g: nightly (refresh)" >> "$O/state.txt"; stage nightly
    fi ;;
  restarts)  # around each card's committed boundary: H200 20-23, H100 15-17 req/s
    local rates=16,20,23
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && rates=11,14,17
    env_run python3 -X faulthandler benchmarks/h200/restarts.py \
      --spec perf_tests/specs/h200-fixed-1024-128.yaml --rates "$rates" --seconds 25 \
      --starts "${RESTART_STARTS:-cold,cached,recompiled}" \
      --out "$O/restarts" > "$O/restarts.log" 2>&1 ;;
  longrun)
    env_run python3 -X faulthandler benchmarks/h200/long_run_check.py \
      --spec perf_tests/specs/h200-fixed-1024-128.yaml \
      --baseline "$(ls "$O"/baselines/*test_h200_fixed_in_tree*/cuda-*.json | head -1)" \
      --seconds 100 --bench-seconds 100 --out "$O/long-run" > "$O/long-run.log" 2>&1 ;;
  slow)
    cat > perf_tests/test_h200_slowdown.py <<'PY'
import pytest

@pytest.mark.moeperf_gpu
@pytest.mark.moeperf_spec("h200-fixed-1024-128.yaml")
@pytest.mark.moeperf_moe_config("moe_configs/h200-poor")
def test_h200_fixed_poor(moeperf) -> None:  # type: ignore[no-untyped-def]
    moeperf.run()
PY
    env_run python3 -X faulthandler -m pytest perf_tests/test_h200_slowdown.py --gpu \
      -p no:cacheprovider -rA --moeperf-runs 2 --moeperf-refresh-baselines \
      --moeperf-reason "known slowdown: poor tiling" --moeperf-baseline-dir "$O/slow-baselines" \
      --moeperf-results "$O/results-slow.json" > "$O/pytest-slow.log" 2>&1
    env_run python3 -m pytest_moeperf.cli compare \
      "$(ls "$O"/baselines/*test_h200_fixed_in_tree*/cuda-*.json | head -1)" \
      "$(ls "$O"/slow-baselines/*/cuda-*.json | head -1)" > "$O/compare-slow.txt" 2>&1 ;;
  gate)
    local G="$O/gate" f=E=128,N=768,device_name=NVIDIA_H200.json
    mkdir -p "$G/cases" "$G/large-M-worse"
    env_run python3 -m pytest_moeperf.ab.perm_cli --make-cases "$G/cases" \
      --base "/root/site/vllm/model_executor/layers/fused_moe/configs/$f" > "$O/gate-cases.log" 2>&1
    cp "$G/cases/large-M-worse.json" "$G/large-M-worse/$f"
    env_run python3 -X faulthandler -m pytest perf_tests/test_moe_ab.py --gpu -k moe_config_ab_h200 \
      -p no:cacheprovider -rA --moeperf-ab-folders "perf_tests/moe_configs/in-tree,$G/large-M-worse" \
      --moeperf-ab-control --moeperf-sweep 16,64,128 --moeperf-ab-summary "$G/ab-summary.md" \
      --moeperf-results "$G/results.json" > "$O/pytest-gate.log" 2>&1 ;;
  kernels)
    local K="$O/kernels" base
    base=/root/site/vllm/model_executor/layers/fused_moe/configs/E=128,N=768,device_name=NVIDIA_H200.json
    mkdir -p "$K/cases"
    cp "$base" "$K/in-tree.json"
    cp perf_tests/moe_configs/h200-poor/*.json "$K/cases/poor.json"
    { env_run python3 benchmarks/h200/perm_kernels.py --make-cases "$K/cases" --base "$base" &&
      env_run python3 -X faulthandler benchmarks/h200/perm_kernels.py --base "$base" \
        --head "$K/cases/large-M-worse.json" --head "$K/cases/one-middle-key-worse.json" \
        --head "$K/cases/reordered.json" --head "$K/cases/poor.json" --budget-s 25 \
        --dtype bf16 --out "$K/bf16" &&
      env_run python3 -X faulthandler benchmarks/h200/perm_kernels.py --base "$base" \
        --head "$K/cases/large-M-worse.json" --budget-s 25 --dtype fp8_w8a8 --out "$K/fp8"
    } > "$O/kernels.log" 2>&1 ;;
  esac
  rc=$?
  echo "$1 rc=$rc wall_s=$(( $(date +%s) - t0 )) end $(date -u +%T)" >> "$O/state.txt"
}
case "${1:-}" in
start)
  mkdir -p "$O" && cp -r baselines "$O/baselines"
  nvidia-smi -q > "$O/nvidia-smi-before.txt" 2>&1
  shift; commit=$1; shift
  # written before the body starts: a `watch` in the same call must find it (2026-12-05 it
  # looked before the first stage had written a line, and stopped as if on a fresh machine)
  echo "started $(date -u +%T): $*" > "$O/state.txt"
  # the stages run from a copy: the device tool replaces the folders it carries at the start of
  # every call, and a stage running in a carried checkout lost its working directory mid-run
  # (2026-12-07: fp8's vLLM failed at start with os.getcwd() FileNotFoundError)
  rm -rf /root/moeperf-src && mkdir -p /root/moeperf-src && cp -r . /root/moeperf-src
  cd /root/moeperf-src
  MOEPERF_GIT_COMMIT="$commit" setsid nohup bash benchmarks/h200/nightly_on_device.sh body "$@" > "$O/driver.log" 2>&1 < /dev/null &
  echo "started $(date -u +%T): $*" ;;
body)
  shift
  (while sleep 15; do
     nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,clocks.mem,temperature.gpu,memory.used \
       --format=csv,noheader >> "$O/gpu-trace.csv" 2>&1
   done) &
  for s in "$@"; do stage "$s"; done
  echo "all done $(date -u +%T)" >> "$O/state.txt" ;;
watch)
  if [ ! -f "$O/state.txt" ]; then  # a fresh machine: the held one went back while idle
    echo "no $O/state.txt: this is not the machine that ran start (it was released); stop" >&2
    exit 3
  fi
  end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$end" ] && ! grep -q "all done" "$O/state.txt" 2>/dev/null; do
    sleep 5
  done
  cat "$O/state.txt" 2>/dev/null
  tail -n 4 "$O"/pytest-*.log "$O/long-run.log" "$O/restarts.log" "$O/kernels.log" 2>/dev/null
  cat "$O/gate/ab-summary.md" 2>/dev/null
  grep -h "SLO boundary\|steady\|tokens a chunk" "$O"/pytest-*.log 2>/dev/null | tail -n 12
  nvidia-smi > "$O/nvidia-smi-now.txt" 2>&1
  # records apart: if they outgrow the 16 MiB a returned file may have, the rest still comes back
  tar -C /root --exclude='moeperf-out/records-*' -czf "$OUT/out.tgz" moeperf-out
  (cd /root && ls -d moeperf-out/records-* >/dev/null 2>&1 && \
    tar -czf "$OUT/records.tgz" moeperf-out/records-*) || true ;;
esac
