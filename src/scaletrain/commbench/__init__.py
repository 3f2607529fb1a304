"""`scaletrain commbench`: collectives timed over message and world sizes, against an alpha-beta model."""
