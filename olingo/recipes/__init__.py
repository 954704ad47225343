"""Recipes: one typed config and one `run_*` function per CLI stage, readable top to bottom."""
