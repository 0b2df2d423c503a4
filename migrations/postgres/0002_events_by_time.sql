-- Event retention walks the log oldest first and deletes in small batches;
-- (at, id) is its scan order and its resumable cursor.
CREATE INDEX events_by_time ON events (at, id);
