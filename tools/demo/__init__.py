"""The demo: real transcripts replayed by simulated agents, with SIGKILLs."""
