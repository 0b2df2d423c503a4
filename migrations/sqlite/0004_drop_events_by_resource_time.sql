-- The timeline reads a window's events through (resource, id) between id
-- bounds found by time (src/store/ui): this index cost every event write
-- one more B-tree page.
DROP INDEX IF EXISTS events_by_resource_time;
