-- Indexes for the web UI's read queries: the events page filtered by holder,
-- the overview's per-kind counts and most contended resources over the
-- last hour (covering, so no table lookups), one lease's story
-- (events by resource and token), and the resource list sorted by activity.

CREATE INDEX events_by_holder ON events (holder, id);
CREATE INDEX events_by_kind_time ON events (kind, at, resource, holder);
CREATE INDEX events_by_resource_token ON events (resource, token, id);
CREATE INDEX resources_by_activity ON resources (last_activity_at);
