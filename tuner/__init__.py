"""The writer side: trace parsing, the store, screening, timing, search, census, export."""
