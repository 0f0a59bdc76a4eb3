"""Fusions: the matching and swapping engine (`engine`) and the patterns it knows."""
