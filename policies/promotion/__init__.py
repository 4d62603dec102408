"""The broadcaster's policy: the held-out gate, the canary and live checks, the guard against the base,
the book of weights versions, and promotion as a pure state machine over it."""
