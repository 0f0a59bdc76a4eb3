"""`nbx-tune report`: the database as one self-contained HTML page (data.py gathers, page.py draws)."""
