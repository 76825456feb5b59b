"""Graders: each turns one sample's output into a verdict, and records its own version with the score."""
