"""The attributor's policy: the step-level judge, its budget and agreement with the environment, and the
signal each served step gets from what happened next in its conversation."""
