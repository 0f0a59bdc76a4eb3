"""How screened survivors are timed: benchmarkers (`benchmarkers`), timing strategies
(`strategies`: `exhaustive`, `pruned`), and certified seats timed against torch
(`torch_baselines`, `nbx-tune baseline`)."""
