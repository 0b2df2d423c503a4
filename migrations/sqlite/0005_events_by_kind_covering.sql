-- One index by kind instead of two. The overview reads the last hour's
-- events of a few kinds through (kind, id) from an id bound found by time
-- (src/store/ui), the way a timeline reads a window through (resource, id);
-- the index carries what those queries read (at, resource, holder), so they
-- touch no table rows. (kind, at, resource, holder) cost every event write
-- one more B-tree insert for the overview alone.
DROP INDEX IF EXISTS events_by_kind_time;
DROP INDEX IF EXISTS events_by_kind;
CREATE INDEX events_by_kind ON events (kind, id, at, resource, holder);
