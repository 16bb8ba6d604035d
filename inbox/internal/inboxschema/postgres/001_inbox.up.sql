-- Dedupe records: one row per event a consumer handled (or skipped as
-- stale). The primary key is what makes a second copy a duplicate.
CREATE TABLE {{table}} (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX {{processed_idx}} ON {{table}} (consumer, processed_at);

-- The version guard: the last version each consumer applied per aggregate.
CREATE TABLE {{versions}} (
    consumer      text        NOT NULL,
    aggregatetype text        NOT NULL,
    aggregateid   text        NOT NULL,
    version       bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregatetype, aggregateid)
);

-- Messages a consumer could not handle, as received.
CREATE TABLE {{dead_letter}} (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer         text        NOT NULL,
    event_id         text        NOT NULL DEFAULT '',
    aggregatetype    text        NOT NULL DEFAULT '',
    aggregateid      text        NOT NULL DEFAULT '',
    type             text        NOT NULL DEFAULT '',
    destination      text        NOT NULL DEFAULT '',
    headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    payload          bytea,
    error            text        NOT NULL,
    dead_lettered_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {{dead_letter_idx}} ON {{dead_letter}} (consumer, id);
