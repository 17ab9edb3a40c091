-- judgequeue 0007: problem packages, uploaded once and referenced by (id, version) from payloads.
--
-- Files are content-addressed (sha256) and stored in chunks, so a package of hundreds of MiB is
-- written in bounded statements and a file shared by two versions is stored once. A file row is
-- written in the same transaction as all its chunks, and a package row only after every file it
-- names: a reader never sees half a package. A package version is immutable: the same version
-- uploaded again must be byte-identical (its manifest digest is the cache key workers use).
CREATE TABLE judgequeue.problem_files (
    sha256      text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size        bigint NOT NULL CHECK (size >= 0),
    chunks      integer NOT NULL CHECK (chunks >= 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE judgequeue.problem_chunks (
    sha256  text NOT NULL REFERENCES judgequeue.problem_files ON DELETE CASCADE,
    seq     integer NOT NULL CHECK (seq >= 0),
    data    bytea NOT NULL,
    PRIMARY KEY (sha256, seq)
);

CREATE TABLE judgequeue.problems (
    id          text NOT NULL CHECK (length(id) <= 100 AND id ~ '^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$'),
    version     integer NOT NULL CHECK (version >= 1),
    manifest    jsonb NOT NULL,
    sha256      text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, version)
);
