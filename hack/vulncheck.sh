#!/usr/bin/env bash
# govulncheck over every package, against vuln.go.dev when it answers, else
# against a database built locally from golang.org/x/vulndb's OSV files as
# the Go module proxy serves them (its cmd/indexdb writes the v1 layout
# govulncheck reads with -db file://). The second is as current as the
# vulndb version the proxy has; the script says which it used.
set -euo pipefail

GO=${GO:-go}
GOVULNCHECK_VERSION=${GOVULNCHECK_VERSION:-v1.9.0}
VULNDB_VERSION=${VULNDB_VERSION:-latest}
DB_DIR=${VULNDB_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keyward/vulndb}
govulncheck=(golang.org/x/vuln/cmd/govulncheck@"$GOVULNCHECK_VERSION")

if curl -fsS --max-time 10 -o /dev/null https://vuln.go.dev/index/db.json 2>/dev/null; then
	echo "vulncheck: database https://vuln.go.dev" >&2
	exec "$GO" run "${govulncheck[@]}" ./...
fi

echo "vulncheck: vuln.go.dev is unreachable; building the database from golang.org/x/vulndb@$VULNDB_VERSION (module proxy)" >&2
info=$("$GO" mod download -json golang.org/x/vulndb@"$VULNDB_VERSION")
dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$info")
version=$(sed -n 's/^[[:space:]]*"Version": "\(.*\)",$/\1/p' <<<"$info")
if [ -z "$dir" ] || [ ! -d "$dir/data/osv" ]; then
	echo "vulncheck: golang.org/x/vulndb@$VULNDB_VERSION has no data/osv directory; cannot build a database" >&2
	exit 1
fi
db="$DB_DIR/$version"
if [ ! -f "$db/index/db.json" ]; then
	rm -rf "$db.tmp"
	"$GO" run golang.org/x/vulndb/cmd/indexdb@"$version" -vulns "$dir/data/osv" -out "$db.tmp"
	mv "$db.tmp" "$db"
fi
echo "vulncheck: database file://$db ($(ls "$db/ID" | grep -c "\.json$") entries, golang.org/x/vulndb@$version)" >&2
exec "$GO" run "${govulncheck[@]}" -db "file://$db" ./...
