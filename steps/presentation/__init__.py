"""What each stage shows, one light module per stage (`SHOWN = Presentation(...)`, steps/core/stage.py):
its report columns, headline, curves, tables and figures, and the params its MLflow runs list. The
stage module builds its STAGE from it and the report reads it (`presentation(stage)`), so the report
never imports a stage's libraries (torch, JAX, transformers): keep these modules free of them at
module level (tests/test_layers.py)."""
