"""fp64 references in numpy, one function per op, written from the op's definition.

Imports numpy only: an oracle that calls the code it judges proves nothing.
"""
