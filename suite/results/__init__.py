"""The read side of results: what tables, `kvbench compare` and the leaderboard compute from the store."""
