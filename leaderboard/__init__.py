"""The Streamlit leaderboard on the DuckDB store (``kvbench leaderboard``)."""
