"""The questioner's policy: the difficulty ladder of dataset tasks, self-written tasks and who writes them,
and the book of synthetic tasks with the band rule that retires them."""
