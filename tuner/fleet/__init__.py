"""Tuning a census's seats: one claimed seat at a time on this device (`seat_tuner`), and
workers on a shared queue (`workers`)."""
