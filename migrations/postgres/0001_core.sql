-- Core schema: resources with their token counters, leases, the fenced value
-- store and the event log. Every time comes from the database clock.

CREATE TABLE resources (
    name             TEXT PRIMARY KEY,
    last_token       BIGINT NOT NULL DEFAULT 0 CHECK (last_token >= 0),
    accepted_token   BIGINT NOT NULL DEFAULT 0 CHECK (accepted_token >= 0 AND accepted_token <= last_token),
    created_at       TIMESTAMPTZ NOT NULL,
    last_activity_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE leases (
    lease_id    TEXT PRIMARY KEY,
    resource    TEXT NOT NULL REFERENCES resources (name),
    token       BIGINT NOT NULL CHECK (token >= 1),
    holder      TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('active', 'released', 'expired', 'force_released')),
    ttl_ms      BIGINT NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    ended_at    TIMESTAMPTZ,
    request_id  TEXT,
    UNIQUE (resource, token)
);

-- The safety net under the row-lock protocol: never two active leases.
CREATE UNIQUE INDEX leases_one_active_per_resource ON leases (resource) WHERE state = 'active';
-- The sweeper's scan.
CREATE INDEX leases_active_by_expiry ON leases (expires_at) WHERE state = 'active';

-- `json`, not `jsonb`: values come back byte for byte as written.
CREATE TABLE fenced_values (
    resource   TEXT PRIMARY KEY REFERENCES resources (name),
    value      JSON NOT NULL,
    token      BIGINT NOT NULL,
    version    BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);

-- Ids come from a sequence, so concurrent transactions on different
-- resources may commit out of id order; `recorded_at` lets readers of the
-- global stream wait briefly at a fresh gap instead of skipping past it.
CREATE TABLE events (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL,
    kind        TEXT NOT NULL,
    resource    TEXT NOT NULL,
    token       BIGINT,
    holder      TEXT,
    detail      JSONB NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX events_by_resource ON events (resource, id);
CREATE INDEX events_by_kind ON events (kind, id);
CREATE INDEX events_by_resource_time ON events (resource, at);
