# Sourced by the bench scripts: fresh Postgres databases, dropped when the
# script exits. Needs PG (the server's URL without a database), psql, and
# optionally PG_PARAMS (a query string for the URLs it hands out).

DATABASES=()

# fresh_db NAME: creates the database NAME, dropped on exit, and sets DB to
# its URL. (Not in a command substitution: DATABASES must reach the exit
# trap.)
fresh_db() {
    psql "$PG/postgres" -qAtc "CREATE DATABASE $1" >/dev/null
    DATABASES+=("$1")
    DB="$PG/$1${PG_PARAMS:+?$PG_PARAMS}"
}

drop_dbs() {
    local name
    for name in "${DATABASES[@]}"; do
        psql "$PG/postgres" -qAtc "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null 2>&1 || true
    done
}
trap drop_dbs EXIT
