-- The in-flight half of the per-key FIFO check: "is a job of this key being processed?" is one
-- probe here. It matters when a job with a smaller id commits after a larger one of the same key
-- was handed out (ids are minted by producers before their transactions commit).
CREATE INDEX jobs_ordering_in_flight ON jobs (queue, ordering_key)
    WHERE state = 'processing' AND ordering_key IS NOT NULL;
