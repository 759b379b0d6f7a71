"""Running one notebook: the sandbox around it, warm starts, and the kit's guarded reads of what a run wrote."""
