#!/bin/bash
# Split the device payload (../shared/gpu/build-payload.sh .gpu: three parts of ~55 MB) into four
# of ~42 MB, with a stage script that waits for four. Why: a device call carries 64 MiB in all,
# the tracked tree included, and at 11.4 MB of tracked files (2026-12-06) a 55 MB part no
# longer fits. Then four calls, each carrying .gpu/nK and .gpu/stage4.sh, each running
# `bash .gpu/stage4.sh` within 30 s of the last; the fourth unpacks vLLM into /root/site and can
# go on with `bash benchmarks/h200/nightly_on_device.sh start COMMIT STAGE...`.
set -euo pipefail
G=${1:-.gpu}
[ -f "$G/p3/payload.sha256" ] || { echo "no $G/p1..p3: run ../shared/gpu/build-payload.sh $G first" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat "$G"/p1/part.* "$G"/p2/part.* "$G"/p3/part.* > "$tmp/all"  # split -n needs a file's size
(cd "$tmp" && split -n 4 -d -a 2 all part. && rm all)
for i in 1 2 3 4; do rm -rf "$G/n$i"; mkdir -p "$G/n$i"; mv "$tmp/part.0$((i - 1))" "$G/n$i/"; done
cp "$G/p3/payload.sha256" "$G/n1/"
# shellcheck disable=SC2016  # the $ are stage.sh's own, matched literally
sed -e 's#"$SRC"/p1 "$SRC"/p2 "$SRC"/p3#"$SRC"/n1 "$SRC"/n2 "$SRC"/n3 "$SRC"/n4#' \
    -e 's/of 3"/of 4"/' -e 's/if \[ "$n" = 3 \]/if [ "$n" = 4 ]/' ../shared/gpu/stage.sh > "$G/stage4.sh"
# shellcheck disable=SC2016
grep -q -F '[ "$n" = 4 ]' "$G/stage4.sh" || { echo "stage.sh changed: edit $G/stage4.sh by hand" >&2; exit 1; }
du -sh "$G"/n?
