"""Constrained decoding: per-request masks built at finalize from committed state (DESIGN §3)."""
