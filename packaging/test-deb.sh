#!/usr/bin/env bash
# Builds the Debian package, installs it with dpkg on this machine, starts
# the relay from the installed files exactly as the installed systemd unit
# says (its User, WorkingDirectory and ExecStart; no systemd needed), checks
# it answers NIP-11 and /healthz with the commit built, then purges the
# package. Run as root (dpkg). CI runs it after the tests (.ci/run);
# docs/install.md says what it shows.
set -euo pipefail
cd "$(dirname "$0")/.."

package=nostr-agent-relay
unit=/usr/lib/systemd/system/relay.service
state=/var/lib/$package
# A port of its own, so that a relay already on 7777 does not answer for it.
port=${DEB_TEST_PORT:-17931}

fail() { echo "test-deb: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root (dpkg -i)"
command -v cargo-deb >/dev/null || cargo install cargo-deb --locked --version 3.8.0
if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed"; then
    fail "$package is installed here; this test installs and purges it, so it will not run beside a real install"
fi
# The state directory is removed at the end only if this run made it.
state_was_there=false
[ -e "$state" ] && state_was_there=true

# The one build README.md runs, then the package from its binaries.
cargo build --release
rm -f target/debian/${package}_*.deb
cargo deb -p relay --no-build
deb=$(ls target/debian/${package}_*.deb)
dpkg -i "$deb"

relay_pid=
cleanup() {
    if [ -n "$relay_pid" ]; then kill "$relay_pid" 2>/dev/null || true; wait "$relay_pid" 2>/dev/null || true; fi
    dpkg --purge "$package" >/dev/null 2>&1 || true
    $state_was_there || rm -rf "$state"
}
trap cleanup EXIT

# What the package installed.
for bin in relay agent relayctl; do [ -x /usr/bin/$bin ] || fail "/usr/bin/$bin missing"; done
[ -f /etc/$package/relay.toml ] || fail "default config missing"
dpkg-query -W -f='${Conffiles}\n' "$package" | grep -q "/etc/$package/relay.toml" || fail "config is not a conffile"
getent passwd relay >/dev/null || fail "no relay user"
[ "$(stat -c '%U %a' "$state")" = "relay 750" ] || fail "$state is $(stat -c '%U %a' "$state")"
if systemd-analyze --help >/dev/null 2>&1; then
    # Warnings about a system not booted with systemd are not the unit's.
    systemd-analyze verify "$unit" 2>&1 | grep -v -e 'not booted' -e 'Failed to' || true
fi

# The unit's own user, directory and command.
user=$(sed -n 's/^User=//p' "$unit")
workdir=$(sed -n 's/^WorkingDirectory=//p' "$unit")
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[ -n "$user" ] && [ -n "$workdir" ] && [ -n "$exec_start" ] || fail "unit lacks User, WorkingDirectory or ExecStart"
log=$(mktemp)
# shellcheck disable=SC2086 # ExecStart is a command line, split as systemd does
(cd "$workdir" && exec setpriv --reuid="$user" --regid="$user" --init-groups env RELAY_LISTEN="127.0.0.1:$port" $exec_start >"$log" 2>&1) &
relay_pid=$!
for _ in $(seq 1 300); do
    grep -q "relay listening on" "$log" && break
    kill -0 "$relay_pid" 2>/dev/null || { cat "$log"; fail "the installed relay exited"; }
    sleep 0.1
done
grep -q "relay listening on" "$log" || { cat "$log"; fail "the installed relay did not listen within 30 s"; }

info=$(curl -fsS -H 'Accept: application/nostr+json' "http://127.0.0.1:$port/")
echo "NIP-11: $info"
echo "$info" | grep -q '"supported_nips"' || fail "NIP-11 answer lacks supported_nips"
health=$(curl -fsS "http://127.0.0.1:$port/healthz")
echo "healthz: $health"
commit=$(git rev-parse --short=12 HEAD)
echo "$health" | grep -q "\"commit\":\"$commit" || fail "/healthz does not name commit $commit"
/usr/bin/relay --version | grep -q "$commit" || fail "relay --version does not name $commit"
/usr/bin/agent --help >/dev/null
/usr/bin/relayctl --help >/dev/null
[ "$(stat -c %U "$state/relay.db")" = "$user" ] || fail "the database is not the relay user's"

# SIGTERM (what systemctl stop sends): a clean exit.
kill -TERM "$relay_pid"
status=0
wait "$relay_pid" || status=$?
relay_pid=
[ "$status" = 0 ] || { cat "$log"; fail "the relay exited $status on SIGTERM"; }

# Purge removes the files and the config, never the state.
dpkg --purge "$package"
[ ! -e /usr/bin/relay ] || fail "/usr/bin/relay left after purge"
[ ! -e /etc/$package/relay.toml ] || fail "the config left after purge"
[ -f "$state/relay.db" ] || fail "purge removed the database"
echo "test-deb: $deb installed, its relay answered NIP-11 on 127.0.0.1:$port as $user, stopped cleanly, purged (state kept)"
