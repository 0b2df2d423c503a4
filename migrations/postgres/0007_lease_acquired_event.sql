-- Each lease row records the id of its `acquired` event. A lease's story
-- reads its events through (resource, id) from that id to the next token's,
-- so the acquisitions no longer need the (resource, token, id) index, which
-- now holds only the rejected writes (they can come at any time, outside
-- that range). An acquisition costs one scattered index insert fewer.
-- The id stays NULL where the event was already pruned: the story then reads
-- from the resource's oldest kept event (src/store/ui, TOKEN_INDEXED_KINDS;
-- the WHERE below must stay exactly that text).
ALTER TABLE leases ADD COLUMN acquired_event_id BIGINT;
UPDATE leases SET acquired_event_id = e.id FROM events AS e
WHERE e.resource = leases.resource AND e.token = leases.token
  AND e.kind IN ('acquired', 'write_rejected') AND e.kind = 'acquired';
DROP INDEX events_by_resource_token;
CREATE INDEX events_rejected_by_resource_token ON events (resource, token, id)
  WHERE kind = 'write_rejected';
