"""Where candidates run: in this process (`executor`), in worker processes (`isolation`,
with `warmup`), compiled ahead on the CPU cores (`precompile`, `preload`)."""
