"""What is measured and reported: the fixed held-out suite and cached scores, the held-out report, the
lineage of weights versions, and the evolution document folded from the event stream."""
