-- Conveyor schema, version 5: API tokens for the HTTP service (`conveyor serve`). The secret is
-- never stored, only its SHA-256; names stay unique for ever (the PostgreSQL migration
-- 0003_tokens.sql has the reasons). ``queues`` is a JSON array of queue names, NULL for every queue.
CREATE TABLE tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL CHECK (role IN ('producer', 'operator', 'admin')),
    queues      TEXT,
    secret_hash TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL,
    revoked_at  REAL
);
