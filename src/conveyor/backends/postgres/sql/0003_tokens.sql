-- Conveyor schema, version 3: API tokens for the HTTP service (`conveyor serve`).
--
-- The secret is never stored, only its SHA-256 (hex): a stolen copy of this table (a backup, a
-- replica) cannot be used to call the API. The secret is 256 random bits, so a fast hash is enough;
-- a slow password hash (bcrypt, argon2) protects low-entropy secrets and would cost every request.
-- A token is looked up by its public id (the part of the bearer string before the secret), then the
-- hashes are compared in constant time in Python. Names stay unique for ever, revoked tokens too:
-- a name is the actor in the audit log, and must keep naming one token.
CREATE TABLE tokens (
    id          text        PRIMARY KEY,
    name        text        NOT NULL UNIQUE,
    role        text        NOT NULL CHECK (role IN ('producer', 'operator', 'admin')),
    queues      text[],
    secret_hash text        NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz,
    revoked_at  timestamptz
);
