#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (seconds, default 60).
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP=1 lets the stable
# toolchain of these machines build with them.
#   cargo install cargo-fuzz
#   fuzz/run.sh 60
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
for t in client_message filter workflow_definition template nip98_header nip_oa; do
    echo "== $t ($secs s)"
    RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1 | grep -E "^#[0-9]+ +DONE|Done [0-9]+ runs|SUMMARY|panicked|ERROR" || true
done
