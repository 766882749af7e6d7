"""TileLang programs of the forward, one kernel family per file (imported lazily: they need tilelang)."""
