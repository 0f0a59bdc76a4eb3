"""The `nbx-tune` command line: Typer commands that parse, call the library, and draw."""
