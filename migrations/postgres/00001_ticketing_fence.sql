-- Fencing high-water table of github.com/ticketing-dev/ticketing/fence.
-- One row per resource; see docs/fence.md.

-- +goose Up
CREATE TABLE ticketing_fence (
    resource   BYTEA       NOT NULL PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 255),
    high_water BIGINT      NOT NULL CHECK (high_water >= 0),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE ticketing_fence;
