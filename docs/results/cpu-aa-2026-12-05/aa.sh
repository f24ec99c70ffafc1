#!/usr/bin/env bash
# A/A: N runs of the embedded default in one session, old method (8c83666) vs new (HEAD), ABAB
set -u
N=${N:-6}
cd /work/main
[ -d /tmp/aa/old ] || git worktree add -f /tmp/aa/old 8c83666 >/dev/null 2>&1
for tag in old1 new1 old2 new2; do
  case $tag in old*) dir=/tmp/aa/old;; new*) dir=/work/main;; esac
  rm -rf /tmp/aa/bl-$tag
  start=$(date +%s)
  (cd $dir && /work/main/.venv/bin/python -m pytest perf_tests/test_embedded.py -p no:cacheprovider \
     --moeperf-runs $N --moeperf-baseline-dir /tmp/aa/bl-$tag --moeperf-results /tmp/aa/res-$tag.json -s) > /tmp/aa/log-$tag.txt 2>&1
  echo "$tag rc=$? $(( $(date +%s) - start )) s" >> /tmp/aa/summary.txt
done
