-- Palisade token enforcement for PostgreSQL. Each "-- name:" section is
-- quoted verbatim in docs/enforcing-tokens.md and run by the test suite
-- (tests/integration/recipes.rs) against a real PostgreSQL.

-- name: schema
-- The highest fencing token this database has accepted, per resource.
CREATE TABLE palisade_fence (
    resource       text   PRIMARY KEY,
    accepted_token bigint NOT NULL CHECK (accepted_token > 0)
);

-- The data the lock protects (an example: one sales report per day).
CREATE TABLE daily_report (
    day          date   PRIMARY KEY,
    total_cents  bigint NOT NULL,
    written_with bigint NOT NULL  -- the token of the last write, for forensics
);

-- name: accept_function
-- Accepts `p_token` for `p_resource` if no higher token was accepted before,
-- and keeps the fence row locked until the caller's transaction ends, so no
-- other writer of this resource can commit in between. A first write for a
-- resource inserts the row; two first writers cannot both insert it.
CREATE FUNCTION palisade_accept_token(p_resource text, p_token bigint)
RETURNS boolean
LANGUAGE sql
AS $$
    INSERT INTO palisade_fence AS f (resource, accepted_token)
    VALUES (p_resource, p_token)
    ON CONFLICT (resource) DO UPDATE
        SET accepted_token = EXCLUDED.accepted_token
        WHERE f.accepted_token <= EXCLUDED.accepted_token
    RETURNING true
$$;

-- name: accept
-- Step 1 of a fenced transaction: true to go on, NULL to roll back.
SELECT palisade_accept_token($1, $2) AS accepted;

-- name: write_report
-- Step 2, in the same transaction: the write itself.
INSERT INTO daily_report (day, total_cents, written_with)
VALUES ($1, $2, $3)
ON CONFLICT (day) DO UPDATE
    SET total_cents = EXCLUDED.total_cents,
        written_with = EXCLUDED.written_with;

-- name: fenced_write
-- Check and write in ONE statement: no row comes back when the token is stale.
WITH fence AS (
    INSERT INTO palisade_fence AS f (resource, accepted_token)
    VALUES ($1, $2)
    ON CONFLICT (resource) DO UPDATE
        SET accepted_token = EXCLUDED.accepted_token
        WHERE f.accepted_token <= EXCLUDED.accepted_token
    RETURNING accepted_token
)
INSERT INTO daily_report (day, total_cents, written_with)
SELECT $3::date, $4::bigint, accepted_token FROM fence
ON CONFLICT (day) DO UPDATE
    SET total_cents = EXCLUDED.total_cents,
        written_with = EXCLUDED.written_with
RETURNING written_with;
