"""The pipeline: a recipe (recipe.py), checked whole before any work (check.py), run on Ray
(runner.py, the only module that imports Ray), counted (stats.py) and reported (report.py)."""
