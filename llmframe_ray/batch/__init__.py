"""The Ray Data ingestion job (imports `ray`; the core packages never do)."""
