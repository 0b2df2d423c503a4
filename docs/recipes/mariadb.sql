-- Palisade token enforcement for MariaDB and MySQL (InnoDB). Each "-- name:"
-- section is quoted verbatim in docs/enforcing-tokens.md and run by the test
-- suite (tests/integration/recipes.rs) against a real MariaDB.

-- name: schema
-- The highest fencing token this database has accepted, per resource.
CREATE TABLE palisade_fence (
    resource       VARCHAR(255) NOT NULL PRIMARY KEY,
    accepted_token BIGINT       NOT NULL
) ENGINE = InnoDB;

-- The data the lock protects (an example: one sales report per day).
CREATE TABLE daily_report (
    day          DATE   NOT NULL PRIMARY KEY,
    total_cents  BIGINT NOT NULL,
    written_with BIGINT NOT NULL
) ENGINE = InnoDB;

-- name: raise_fence
-- Step 1, inside START TRANSACTION: insert-or-raise the fence atomically.
-- The upsert takes an exclusive lock on the row until COMMIT or ROLLBACK.
INSERT INTO palisade_fence (resource, accepted_token)
VALUES (?, ?)
ON DUPLICATE KEY UPDATE
    accepted_token = GREATEST(accepted_token, VALUES(accepted_token));

-- name: read_fence
-- Step 2: the fence after step 1 (this transaction's own, locked row).
-- Go on only if it equals your token; otherwise ROLLBACK: it is stale.
SELECT accepted_token FROM palisade_fence WHERE resource = ?;

-- name: write_report
-- Step 3: the write itself, then COMMIT.
INSERT INTO daily_report (day, total_cents, written_with)
VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE
    total_cents = VALUES(total_cents),
    written_with = VALUES(written_with);
