-- The (resource, token, id) index keeps only the events a lease's story
-- cannot find otherwise: each token's `acquired` event, which bounds the
-- range of (resource, id) that holds the lease's renewals, accepted writes
-- and ending (all written under the resource's lock while it is the newest
-- lease), and the rejected writes, which can come at any time. Every other
-- event costs one index insert fewer (src/store/ui, TOKEN_INDEXED_KINDS;
-- the WHERE below must stay exactly that text).
DROP INDEX IF EXISTS events_by_resource_token;
CREATE INDEX events_by_resource_token ON events (resource, token, id)
  WHERE kind IN ('acquired', 'write_rejected');
