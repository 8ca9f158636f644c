"""The run folder: what a run writes, how it is read back, and the state a resume needs."""
