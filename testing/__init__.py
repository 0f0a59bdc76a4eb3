"""Test helpers shipped with the package: the serve() differential harness (opinfo.py)."""
