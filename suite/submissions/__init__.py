"""Submissions to a public leaderboard: `kvbench export` packs runs into a bundle, `kvbench accept` checks
and records it, `kvbench verify` re-runs a sample of it, `kvbench withdraw` takes it back."""
