-- Core schema: resources with their token counters, leases, the fenced value
-- store and the event log. Times are Unix milliseconds (the database clock).

CREATE TABLE resources (
    name             TEXT PRIMARY KEY,
    last_token       INTEGER NOT NULL DEFAULT 0 CHECK (last_token >= 0),
    accepted_token   INTEGER NOT NULL DEFAULT 0 CHECK (accepted_token >= 0 AND accepted_token <= last_token),
    created_at       INTEGER NOT NULL,
    last_activity_at INTEGER NOT NULL
) STRICT;

CREATE TABLE leases (
    lease_id    TEXT PRIMARY KEY,
    resource    TEXT NOT NULL REFERENCES resources (name),
    token       INTEGER NOT NULL CHECK (token >= 1),
    holder      TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('active', 'released', 'expired', 'force_released')),
    ttl_ms      INTEGER NOT NULL,
    acquired_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    request_id  TEXT,
    UNIQUE (resource, token)
) STRICT;

-- The safety net under the row-lock protocol: never two active leases.
CREATE UNIQUE INDEX leases_one_active_per_resource ON leases (resource) WHERE state = 'active';
-- The sweeper's scan.
CREATE INDEX leases_active_by_expiry ON leases (expires_at) WHERE state = 'active';

CREATE TABLE fenced_values (
    resource   TEXT PRIMARY KEY REFERENCES resources (name),
    value      TEXT NOT NULL,
    token      INTEGER NOT NULL,
    version    INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

-- AUTOINCREMENT: event ids are cursors for readers and must never be reused.
CREATE TABLE events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    resource TEXT NOT NULL,
    token    INTEGER,
    holder   TEXT,
    detail   TEXT NOT NULL
) STRICT;

CREATE INDEX events_by_resource ON events (resource, id);
CREATE INDEX events_by_kind ON events (kind, id);
CREATE INDEX events_by_resource_time ON events (resource, at);
