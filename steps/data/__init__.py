"""Data sources shared by the data stages (corpus text, MCQ rows)."""
