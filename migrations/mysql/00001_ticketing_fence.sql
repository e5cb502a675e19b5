-- Fencing high-water table of github.com/ticketing-dev/ticketing/fence.
-- One row per resource; see docs/fence.md. MySQL 8 / MariaDB 10.5+.

-- +goose Up
CREATE TABLE ticketing_fence (
    resource   VARBINARY(255) NOT NULL PRIMARY KEY,
    high_water BIGINT         NOT NULL,
    updated_at DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    CONSTRAINT ticketing_fence_resource_len CHECK (LENGTH(resource) >= 1),
    CONSTRAINT ticketing_fence_high_water CHECK (high_water >= 0)
) ENGINE=InnoDB;

-- +goose Down
DROP TABLE ticketing_fence;
