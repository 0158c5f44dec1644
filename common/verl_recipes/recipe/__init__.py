"""A recipe: its metadata (`recipe.yaml`) and its config composed against verl's Hydra tree."""
