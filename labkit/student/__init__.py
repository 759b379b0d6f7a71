"""The student's command, `make lab-N`: one lab on each configuration, and the table of what passed where."""
