"""Certifying one seat: candidates, static prune, screen against the oracle, precision
gate, confirm (`tune`, `screen`, `screen_shapes`), re-certification from history
(`recertify`), what a certificate was made under (`provenance`), refusal reasons."""
